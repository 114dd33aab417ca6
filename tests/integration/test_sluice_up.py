"""`sluice up`: the embedded stack starts with one command, Ctrl-C stops all of it, and what it
keeps in its data folder is there again at the next start."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import requests

from sluice.embedded import free_port
from tests.integration.conftest import closing_client, write_project
from tests.integration.processes import children_of
from tests.integration.test_realtime import write_realtime_project

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _start_up(port: int, env: dict[str, str], data_dir: Path, *args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "up", "--port", str(port), "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    url = process.stdout.readline().strip()  # printed once everything is ready
    return process, url


def _stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=90) == 0, process.stderr.read()
    return process.stderr.read()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status != "Z"


def test_sluice_up_without_a_redis_url_runs_a_private_redis_and_ctrl_c_stops_everything(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"}
    port = free_port()
    process, url = _start_up(port, env, tmp_path / "home", "--verbose")
    try:
        assert url == f"http://127.0.0.1:{port}"
        health = requests.get(f"{url}/healthz", timeout=10).json()
        assert health["status"] == "ok" and len(health["worker_nodes"]) == 1
        children = children_of(process.pid)
        names = {Path(f"/proc/{c}/comm").read_text().strip() for c in children}
        assert any("redis" in n for n in names), names
        assert len(children) == 5  # redis, api, the proxy, beat, the worker host (its node is its child)
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    assert not any(_alive(c) for c in children)
    banner = process.stderr.read()
    # The banner names the private Redis for Flower, and --verbose showed the processes' own lines.
    redis_url = banner.split("redis at ", 1)[1].split(";", 1)[0]
    assert f"celery --broker {redis_url} flower" in banner
    assert f"docs at {url}/docs" in banner
    shown = {line.split(" | ", 1)[0] for line in banner.splitlines() if " | " in line}
    assert {"api", "beat", "redis"} <= shown, banner
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/healthz", timeout=5)


def test_sluice_up_with_a_redis_url_uses_that_redis(redis_server, tmp_path):
    shared = redis_server.rsplit("/", 1)[0] + "/2"
    client = redis.Redis.from_url(shared)
    client.flushdb()
    port = free_port()
    process, url = _start_up(port, {**os.environ, "SLUICE_REDIS_URL": shared}, tmp_path / "home")
    try:
        assert url == f"http://127.0.0.1:{port}"
        assert client.hlen("sluice:nodes") == 1  # the worker registered in the given Redis
        names = {Path(f"/proc/{c}/comm").read_text().strip() for c in children_of(process.pid)}
        assert not any("redis" in n for n in names), names
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)
    client.flushdb()


def _sluice(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "--url", url, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_a_stopped_stack_started_again_on_its_data_folder_has_its_apis_jobs_and_outputs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"}
    home, port = tmp_path / "home", free_port()
    batch = write_project(tmp_path / "keep", "keep", {})
    realtime = write_realtime_project(tmp_path / "greeter", "greeter")
    process, url = _start_up(port, env, home)
    try:
        assert _sluice(url, "deploy", "--no-wait", str(batch)).returncode == 0
        assert _sluice(url, "deploy", "--no-wait", str(realtime)).returncode == 0
        client = closing_client(url)
        spec = client.submit_job("keep", {"workers": 1, "item_list": {"items": [1, 2, 3], "batch_size": 1},
                                          "config": {"events": str(tmp_path / "events.jsonl")}})
        assert client.wait_job("keep", spec["job_id"], timeout=120)["status"] == "status_succeeded"
    finally:
        said = _stop(process)
    assert f"state in {home}" in said and f"logs in {home / 'logs'}" in said
    private_redis = said.split("redis at ", 1)[1].split(";", 1)[0]

    process, url = _start_up(port, env, home)
    try:
        client = closing_client(url)
        assert {api["name"] for api in client.apis()} == {"keep", "greeter"}
        job = client.get_job("keep", spec["job_id"])["job_status"]
        assert job["status"] == "status_succeeded" and job["batch_metrics"]["succeeded"] == 3
        client.wait_ready("greeter", timeout=120)  # its replica is placed on this host again and started
        assert client.predict("greeter", {"hello": "again"})["echo"] == {"hello": "again"}
        # A second stack on the same folder is refused at once, naming the one that holds it.
        second = subprocess.run([sys.executable, "-m", "sluice.cli", "up", "--port", str(free_port()), "--data-dir",
                                 str(home)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        assert second.returncode != 0
        assert f"another sluice up (pid {process.pid}) uses {home}" in second.stderr
    finally:
        said_again = _stop(process)
    # The private Redis listens where it did before: Flower's command from the banner works again.
    assert f"redis at {private_redis};" in said_again

    process, url = _start_up(port, env, home, "--fresh")
    try:
        assert closing_client(url).apis() == []
    finally:
        _stop(process)


def test_a_busy_port_is_named_with_what_to_do_and_nothing_is_left_running(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "sluice.cli", "up", "--port", str(port), "--data-dir",
                                 str(tmp_path / "home")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert result.returncode != 0
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"port {port} is in use" in line and "--port" in line


def test_a_redis_that_cannot_start_is_reported_with_its_own_words_and_its_log_kept(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"}
    home = tmp_path / "home"
    aof = home / "redis" / "appendonlydir"
    aof.mkdir(parents=True)
    (aof / "appendonly.aof.manifest").write_text("this is not a manifest\n")
    result = subprocess.run([sys.executable, "-m", "sluice.cli", "up", "--port", str(free_port()), "--data-dir",
                             str(home)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=90)
    assert result.returncode != 0
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: redis-server exited: ") and "manifest" in line.lower(), line
    assert str(home / "logs" / "redis.log") in line and (home / "logs" / "redis.log").read_text()


def test_a_missing_haproxy_is_named_with_how_to_install_it(tmp_path):
    bin_dir = tmp_path / "bin"  # redis-server and Python, but no haproxy
    bin_dir.mkdir()
    for tool in ("redis-server",):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**{k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"},
           "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent)])}
    result = subprocess.run([sys.executable, "-m", "sluice.cli", "up", "--port", str(free_port()), "--data-dir",
                             str(tmp_path / "home")], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert result.returncode != 0
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "haproxy is not installed (apt-get install -y haproxy)" in line
