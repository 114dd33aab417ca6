"""Fixtures shared by every test: a real redis-server on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sluice.embedded import free_port  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def tool_state_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Hypothesis keeps its example database in `./.hypothesis` unless told otherwise; here, and in
    every child process (schemathesis's CLI runs on it), it goes to the session's temporary folder,
    so that a test run leaves nothing in the checkout."""
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(tmp_path_factory.mktemp("hypothesis")))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A private redis-server for the whole session; yields its URL."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `make test` installs it with apt")
    port = free_port()
    folder = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    yield url
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def redis_client(redis_server: str):
    """A clean database (number 1, apart from the stacks' database 0) for one test."""
    client = redis.Redis.from_url(redis_server.rsplit("/", 1)[0] + "/1")
    client.flushdb()
    yield client
    client.flushdb()


# --- Storage servers: moto (S3) and gcp-storage-emulator (GCS) as real child processes ---------

import os  # noqa: E402, I001

def _start_server(command: list[str], probe_url: str, name: str, cwd: Path) -> subprocess.Popen:
    """Start `command` and wait until `probe_url` answers any HTTP status; fail the session if it never does."""
    import requests

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with status {process.returncode} before answering: {' '.join(command)}")
        try:
            requests.get(probe_url, timeout=1)
            return process
        except requests.RequestException:
            time.sleep(0.05)
    process.terminate()
    pytest.fail(f"{name} did not answer on {probe_url} within 30s")


def _stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 server for the whole session; yields its endpoint URL.

    Sets AWS_ENDPOINT_URL and test credentials in os.environ for the session, so boto3 here and
    in any child process started later talks to it.
    """
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = _start_server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            endpoint + "/", "moto S3 server", tmp_path_factory.mktemp("moto"))
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {name: os.environ.get(name) for name in [*env, "AWS_SESSION_TOKEN", "AWS_PROFILE"]}
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        _restore_environ(saved)
        _stop_server(process)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory):
    """gcp-storage-emulator (in memory) for the whole session; yields its URL.

    Sets STORAGE_EMULATOR_HOST and GOOGLE_CLOUD_PROJECT in os.environ for the session.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start_server(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port", str(port),
         "--in-memory", "--quiet"],
        url + "/storage/v1/b", "gcp-storage-emulator", tmp_path_factory.mktemp("gcs"),
    )
    saved = {name: os.environ.get(name) for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}
    os.environ.update({"STORAGE_EMULATOR_HOST": url, "GOOGLE_CLOUD_PROJECT": "test"})
    try:
        yield url
    finally:
        _restore_environ(saved)
        _stop_server(process)


def _restore_environ(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _bucket_name() -> str:
    import uuid

    return f"sluice-test-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def s3_bucket(s3_server: str) -> str:
    """A fresh, empty S3 bucket on the session's moto server; yields its name."""
    import boto3

    name = _bucket_name()
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return name


@pytest.fixture
def gcs_bucket(gcs_server: str) -> str:
    """A fresh, empty GCS bucket on the session's emulator; yields its name."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    name = _bucket_name()
    storage.Client(project="test", credentials=AnonymousCredentials()).create_bucket(name)
    return name
