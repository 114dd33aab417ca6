"""A real Sluice stack for the integration tests: redis-server, Celery worker nodes, beat, gunicorn.

Tests deploy small Cortex-style projects written on the fly; their predictors append JSON
lines to an events file, so a test can see what ran, where, and how often.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from foundation.hosts import Resources
from sluice.client import Client
from sluice.embedded import Stack, free_port
from testbed.wheels import make_wheelhouse

# The room a test stack offers to replicas: many APIs of the tests, each taking its `compute` (the
# examples ask 1 cpu), share one stack on a 2-core machine; placement's limits have tests of their own.
ROOM = Resources(cpu_m=256_000, mem=1024 * 2**30, gpu=0)

FAST_LOOPS = {
    "SLUICE_BEAT_INTERVAL": "1",
    "SLUICE_HEARTBEAT_INTERVAL": "0.5",
    "SLUICE_NODE_TTL": "4",
    "SLUICE_MODEL_POLL_INTERVAL": "0.5",
    "SLUICE_ENQUEUE_STALE_AFTER": "3",
}

# A predictor whose behaviour the job's config drives; every call leaves an event line.
EVENTS_PREDICTOR = '''
import json, os, time, uuid

GLOBAL_MARK = "global scope ran"


def _order(item):
    number = isinstance(item, (int, float))
    return (not number, item if number else json.dumps(item, sort_keys=True))


class {class_name}:
    def __init__(self, config, job_spec):
        self.config = config
        self.job_spec = job_spec
        self.instance = uuid.uuid4().hex
        self.items = []
        if config.get("fail_init"):
            raise RuntimeError("the model file is corrupt")
        self._log({{"event": "init", "config": config, "job_spec": job_spec, "cwd": os.getcwd(),
                   "greeting": os.environ.get("GREETING"), "global": GLOBAL_MARK,
                   "version": "{version}"}})

    def _log(self, record):
        record.update(instance=self.instance, pid=os.getpid(), job_id=self.job_spec["job_id"])
        with open(self.config["events"], "a") as f:
            f.write(json.dumps(record) + "\\n")

    def {predict_name}(self, payload, batch_id):
        hang = self.config.get("hang_marker")
        if hang and payload[0] == self.config.get("hang_on") and not os.path.exists(hang):
            with open(hang, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(120)
        self._log({{"event": "predict", "batch_id": batch_id, "items": payload, "version": "{version}"}})
        if self.config.get("sleep"):
            time.sleep(self.config["sleep"])
        for item in payload:
            if item == self.config.get("poison"):
                raise ValueError(f"cannot handle item {{item}}")
        self.items.extend(payload)
        if self.config.get("return_rows"):
            return [{{"item": item, "batch": batch_id}} for item in payload]

    def on_job_complete(self, job_status):
        self._log({{"event": "complete", "seen": sorted(self.items, key=_order), "version": "{version}",
                   "job_status": job_status}})
'''


# A small bound on every log stream (`SLUICE_LOG_LINES`, default 10,000), so that a chatty job of
# test_logs.py shows the bound at work; no other test reads more than a few lines back.
LOG_LINES = 200


def closing_client(url: str, **kwargs: Any) -> Client:
    """A client that keeps no idle keep-alive connection to the proxy.

    After a reload, an old haproxy worker lingers while idle keep-alive connections hold it (up
    to the proxy's keep-alive timeout, 10 s), and a draining replica, or the proxy's own stop,
    waits for it. A test client's idle connection must not be what a stop waits for.
    """
    client = Client(url, **kwargs)
    client._session.headers["Connection"] = "close"
    return client


# The stacks are started once per session, each on first use, and shared by every module that
# runs on its configuration; a test that needs a setting of its own makes it per API or per job
# where Sluice has one, or runs on a stack below whose configuration says why it differs.
@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' own packages (testbed/wheels.py), the only place projects' requirements come from."""
    return make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, s3_server: str, gcs_server: str, wheelhouse: Path):
    """Two worker nodes, beat, the API, the proxy and realtime replicas against a private Redis.

    They reach the session's S3 and GCS servers (the storage fixtures export their addresses),
    may read and write local paths under the session's temporary folder, and install projects'
    requirements from the tests' wheelhouse alone (no package index).
    """
    data_dir = tmp_path_factory.mktemp("stack")
    env = {**FAST_LOOPS, "SLUICE_LOCAL_INPUT_ROOTS": str(tmp_path_factory.getbasetemp()),
           "SLUICE_LOG_LINES": str(LOG_LINES), "SLUICE_FIND_LINKS": str(wheelhouse), "SLUICE_NO_INDEX": "1"}
    with Stack(port=free_port(), offers=ROOM, workers=2, data_dir=data_dir, env=env) as running:
        yield running
        print(running.logs())


@pytest.fixture(scope="session")
def client(stack: Stack) -> Client:
    return closing_client(stack.url)


# The hard stop's grace (`SLUICE_HARD_STOP_GRACE_S`, default 5): long enough for the watchdog thread
# to record a timed-out try first, short for a predictor holding the GIL (test_time_limits.py).
HARD_STOP_GRACE_S = 2


@pytest.fixture(scope="session")
def one_node_stack(tmp_path_factory: pytest.TempPathFactory):
    """A stack with a single worker node, so that every job runs in the same process, one after
    another: what a hung predictor blocks, and what one process keeps between jobs
    (test_time_limits.py, test_isolation.py)."""
    data_dir = tmp_path_factory.mktemp("one-node-stack")
    env = {**FAST_LOOPS, "SLUICE_HARD_STOP_GRACE_S": str(HARD_STOP_GRACE_S)}
    with Stack(port=free_port(), offers=ROOM, workers=1, data_dir=data_dir, env=env) as running:
        yield running
        print(running.logs())


@pytest.fixture(scope="session")
def realtime_storage(s3_server: str) -> str:
    import boto3

    bucket = f"sluice-realtime-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/sluice"


@pytest.fixture(scope="session")
def realtime_stack(tmp_path_factory: pytest.TempPathFactory, realtime_storage: str):
    """The proxy, the management API and the replica manager, no worker node and no beat, with its
    bundles on the session's S3 server, so that a second `sluice serve` with its own working folder,
    as another host would run it, can fetch them too (test_realtime.py, test_realtime_load.py).

    Its tests delete the APIs they deploy, so that the next test's proxy carries only its own
    routes and no idle replica shares the machine with its load.
    """
    data_dir = tmp_path_factory.mktemp("realtime-stack")
    env = {**FAST_LOOPS, "SLUICE_STORAGE": realtime_storage}
    with Stack(port=free_port(), offers=ROOM, workers=0, beat=False, data_dir=data_dir, env=env) as running:
        yield running
        print(running.logs())


def write_project(
    folder: Path, api_name: str, config: dict[str, Any] | None = None, class_name: str = "PythonPredictor",
    predict_name: str = "predict", version: str = "v1", predictor_extra: dict[str, Any] | None = None,
    files: dict[str, str] | None = None, source: str | None = None, predictor_type: str = "python",
    compute: dict[str, Any] | None = None,
) -> Path:
    """A Cortex-style project folder; returns the path of its cortex.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    code = source or EVENTS_PREDICTOR.format(class_name=class_name, predict_name=predict_name, version=version)
    (folder / "predictor.py").write_text(code)
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    predictor = {"type": predictor_type, "path": "predictor.py", "config": config or {}, **(predictor_extra or {})}
    api = {"name": api_name, "kind": "BatchAPI", "predictor": predictor, "compute": compute or {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


@pytest.fixture
def deploy_project(client: Client, tmp_path: Path) -> Callable[..., str]:
    """Write and deploy a project under a fresh API name; returns the name."""

    def deploy(config: dict[str, Any] | None = None, name: str | None = None, **kwargs: Any) -> str:
        api_name = name or f"t-{uuid.uuid4().hex[:10]}"
        client.deploy(write_project(tmp_path / api_name, api_name, config, **kwargs))
        return api_name

    return deploy


@pytest.fixture(params=["local", "s3", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh folder as a URI, once on each backend: local disk, S3 (moto), GCS (emulator)."""
    if request.param == "local":
        return str(tmp_path / "data")
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}/data"
    return f"gs://{request.getfixturevalue('gcs_bucket')}/data"


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    return tmp_path / "events.jsonl"


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events written so far; a line still being appended (no newline yet) is left for the next read."""
    if not path.exists():
        return []
    text = path.read_text()
    whole = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in whole.splitlines() if line.strip()]


@pytest.fixture
def events() -> Callable[[Path], list[dict[str, Any]]]:
    return read_events
