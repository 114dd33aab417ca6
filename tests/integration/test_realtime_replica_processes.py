"""A realtime replica with real processes: sibling gunicorn workers that live and die, and a
gunicorn started from the launcher's environment serving its API.

The replica app's logic with siblings said to be alive is fast: tests/unit/test_realtime_app.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from foundation.replica_directory import ReadinessMarkers
from predictors_runtime.realtime_predictor import RealtimePredictor
from sluice.embedded import free_port
from testbed.waiting import wait_for
from tests.unit.test_realtime_app import WAIT_S, Echo, deployed, replica_app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_replica_of_several_processes_is_ready_only_when_all_are(tmp_path):
    client = replica_app(tmp_path, Echo(), processes_per_replica=2).test_client()
    waiting = client.get("/iris")
    assert waiting.status_code == 503
    assert "1 of 2 processes" in waiting.get_json()["message"]
    assert client.post("/iris", json=1).status_code == 200  # this process serves meanwhile

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ReadinessMarkers(tmp_path / "state").mark_ready(pid=other.pid)
        assert client.get("/iris").get_json() == {"ready": True, "models": []}
    finally:
        other.kill()
        other.wait()
    assert client.get("/iris").status_code == 503


def test_a_process_replacing_a_dead_one_builds_before_it_takes_requests(tmp_path):
    """Its siblings are serving: it must not answer 503 "still being built" meanwhile."""
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ReadinessMarkers(tmp_path / "state").mark_ready(pid=sibling.pid)

        def slow_build(settings, api):
            time.sleep(0.3)
            return RealtimePredictor(Echo())

        client = replica_app(tmp_path, build=slow_build, wait=False, processes_per_replica=2).test_client()
        assert client.post("/iris", json=1).status_code == 200  # built before the app was handed over
    finally:
        sibling.kill()
        sibling.wait()


PROJECT_PREDICTOR = '''
import json
import os
import time

from cortex_internal.lib.log import logger as cortex_logger


class PythonPredictor:
    def __init__(self, config):
        with open("labels.json") as f:  # relative to the project folder, as in Cortex
            self.labels = json.load(f)
        self.done_file = config["done_file"]
        self.gate = config["gate"]

    def predict(self, payload, headers):
        cortex_logger.info("received payload", extra={"payload": payload})
        return {"label": self.labels[payload["index"]], "greeting": os.environ["GREETING"]}

    def post_predict(self, response):
        give_up = time.monotonic() + 60
        while not os.path.exists(self.gate) and time.monotonic() < give_up:  # until the test opens it
            time.sleep(0.01)
        with open(self.done_file, "w") as f:
            json.dump(response, f)
'''


@pytest.mark.parametrize("worker_class", ["sluice.keepalive_worker.KeepAliveSyncWorker", "gthread"])
def test_a_gunicorn_replica_started_from_the_launchers_environment_serves_its_api(tmp_path, worker_class):
    project = tmp_path / "project"
    project.mkdir()
    (project / "predictor.py").write_text(textwrap.dedent(PROJECT_PREDICTOR))
    (project / "labels.json").write_text(json.dumps(["setosa", "versicolor"]))
    (project / ".env").write_text("GREETING=hello\n")
    done, gate = tmp_path / "post_predict_done.json", tmp_path / "gate"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(deployed(config={"done_file": str(done), "gate": str(gate)}).to_dict()))
    port = free_port()
    env = {
        **os.environ,
        "GREETING": "hello",  # the launcher exports .env and predictor.env into the replica's environment
        "SLUICE_REPLICA_SPEC": str(spec),
        "SLUICE_REPLICA_PROJECT": str(project),
        "SLUICE_REPLICA_STATE_DIR": str(tmp_path / "state"),
        "SLUICE_REPLICA_ID": "iris-test",
        "SLUICE_CACHE_DIR": str(tmp_path / "cache"),
    }
    log_path = tmp_path / "replica.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "--worker-class", worker_class,
             "--threads", "2", "--pythonpath", str(ROOT), "api.realtime:create_replica_app()"],
            cwd=project, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/iris"
    try:
        def ready() -> bool:
            assert process.poll() is None, log_path.read_text()
            try:
                return requests.get(url, timeout=5).status_code == 200
            except (requests.ConnectionError, requests.Timeout):
                return False  # gunicorn listens before its worker has imported the app

        wait_for(ready, WAIT_S, "the replica to be ready")
        try:
            answer = requests.post(url, json={"index": 1}, headers={"X-Request-ID": "g-1"}, timeout=WAIT_S)
            assert answer.json() == {"label": "versicolor", "greeting": "hello"}
            assert answer.headers["X-Request-ID"] == "g-1"
            assert not done.exists()  # sent while post_predict still waits at its gate
        finally:
            gate.touch()
        wait_for(done.exists, WAIT_S, "post_predict to write its file")
        assert json.loads(done.read_text()) == {"label": "versicolor", "greeting": "hello"}

        def logged() -> list[dict[str, Any]]:
            lines = []
            for raw in log_path.read_text().splitlines():
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    continue  # gunicorn's own lines
            return [line for line in lines if line.get("message") == "received payload"]

        wait_for(logged, WAIT_S, "the predictor's log line")
        assert logged()[0]["payload"] == {"index": 1}
        assert logged()[0]["labels"] == {"api": "iris", "request_id": "g-1"}
    finally:
        process.terminate()
        process.wait(WAIT_S)
