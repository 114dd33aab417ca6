"""`sluice logs`: a job's lines gathered from every worker process, and a realtime API's replicas' lines.

On the session's stack: two worker nodes and a small bound on a log stream (`SLUICE_LOG_LINES`,
conftest.py's LOG_LINES), so that a chatty job shows the bound at work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sluice.client import TERMINAL_STATUSES, ApiNotFound, BadRequest, Client, JobNotFound
from sluice.embedded import Stack

from .conftest import LOG_LINES, closing_client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0

# Logs a line per item through Cortex's logger; `rendezvous` holds the first batches until two
# processes run one, so that the job's lines surely come from two workers.
BATCH_PREDICTOR = '''
import os, time

from cortex_internal.lib.log import logger


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config

    def _meet(self):
        folder = self.config["rendezvous"]
        open(os.path.join(folder, str(os.getpid())), "w").close()
        deadline = time.monotonic() + 60
        while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)

    def predict(self, payload, batch_id):
        if self.config.get("rendezvous"):
            self._meet()
        for item in payload:
            logger.info("item %s", item, extra={"item": item})
        time.sleep(self.config.get("sleep", 0))

    def on_job_complete(self, job_status):
        logger.info("job complete", extra={"succeeded": job_status["batch_metrics"]["succeeded"]})
'''

REALTIME_PREDICTOR = '''
from foundation.json_logs import logger


class PythonPredictor:
    def __init__(self, config):
        logger.info("loaded the model")

    def predict(self, payload):
        logger.info("predicting", extra={"payload": payload})
        return {"ok": True}
'''


@pytest.fixture(scope="module")
def logs_stack(stack: Stack) -> Stack:
    return stack


@pytest.fixture(scope="module")
def logs_client(logs_stack: Stack) -> Client:
    return closing_client(logs_stack.url, timeout=30)


def _deploy(client: Client, folder: Path, kind: str, source: str, config: dict[str, Any] | None = None) -> str:
    name = f"logs-{uuid.uuid4().hex[:8]}"
    folder = folder / name
    folder.mkdir(parents=True)
    (folder / "predictor.py").write_text(source)
    api: dict[str, Any] = {"name": name, "kind": kind, "predictor": {"type": "python", "path": "predictor.py",
                                                                    "config": config or {}}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    return name


def sluice(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "sluice.cli", "--url", url, *args]


def run_sluice(url: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_URL"}
    return subprocess.run(sluice(url, *args), capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def all_lines(client: Client, api: str, job_id: str | None = None) -> list[dict[str, Any]]:
    lines, after = [], None
    while True:
        page = client.get_logs(api, job_id, after=after)
        if not page["lines"]:
            return lines
        lines += page["lines"]
        after = page["next"]


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {WAIT_S:.0f}s")


def test_a_jobs_lines_from_two_worker_processes_are_read_back_labelled_with_the_job(logs_client, tmp_path):
    rendezvous = tmp_path / "rendezvous"
    rendezvous.mkdir()
    api = _deploy(logs_client, tmp_path, "BatchAPI", BATCH_PREDICTOR, {"rendezvous": str(rendezvous)})
    job_id = logs_client.submit(api, list(range(6)), batch_size=1, workers=2)["job_id"]

    final = logs_client.wait_job(api, job_id, timeout=180)

    assert final["status"] == "status_succeeded", final
    lines = wait_for(lambda: (found := all_lines(logs_client, api, job_id)) and
                     any(line["message"] == "job complete" for line in found) and found, "the completion's line")
    items = [line for line in lines if "item" in line]
    assert sorted(line["item"] for line in items) == list(range(6))
    assert [line["message"] for line in items] == [f"item {line['item']}" for line in items]
    assert {line["labels"]["job_id"] for line in lines} == {job_id}
    assert sorted(line["labels"]["batch_index"] for line in items) == [str(n) for n in range(6)]
    assert len({line["process"] for line in items}) == 2, "the lines of both workers are gathered"
    assert len({line["labels"]["node"] for line in items}) == 2  # each names the node (name@host) that wrote it
    assert all("@" in line["labels"]["node"] for line in items)
    [complete] = [line for line in lines if line["message"] == "job complete"]
    assert complete["succeeded"] == 6 and "batch_index" not in complete["labels"]


def test_lines_are_read_a_page_at_a_time_and_unknown_names_are_404s(logs_stack, logs_client, tmp_path):
    api = _deploy(logs_client, tmp_path, "BatchAPI", BATCH_PREDICTOR)
    job_id = logs_client.submit(api, list(range(5)), batch_size=5, workers=1)["job_id"]
    logs_client.wait_job(api, job_id, timeout=180)
    wait_for(lambda: sum("item" in line for line in all_lines(logs_client, api, job_id)) == 5, "the job's lines")

    first = logs_client.get_logs(api, job_id, limit=2)
    rest = logs_client.get_logs(api, job_id, after=first["next"])

    items = [line["item"] for line in first["lines"] + rest["lines"] if "item" in line]
    assert len(first["lines"]) == 2 and items == list(range(5))
    assert logs_client.get_logs(api, job_id, after=rest["next"]) == {"lines": [], "next": rest["next"]}
    with pytest.raises(JobNotFound):
        logs_client.get_logs(api, "no-such-job")
    with pytest.raises(ApiNotFound):
        logs_client.get_logs("no-such-api", job_id)
    with pytest.raises(ApiNotFound):
        logs_client.get_logs("no-such-api")
    with pytest.raises(BadRequest, match="after must be a log position"):
        logs_client.get_logs(api, job_id, after="yesterday")
    with pytest.raises(BadRequest, match="its logs are per job"):
        logs_client.get_logs(api)
    answer = requests.get(f"{logs_stack.url}/batch/{api}/no-such-job/logs", timeout=30)
    assert answer.status_code == 404 and answer.json()["kind"] == "job_not_found"


def test_logs_follow_prints_a_jobs_lines_as_it_runs_and_ends_when_the_job_ends(logs_stack, logs_client, tmp_path):
    api = _deploy(logs_client, tmp_path, "BatchAPI", BATCH_PREDICTOR, {"sleep": 0.3})
    job_id = logs_client.submit(api, list(range(8)), batch_size=1, workers=1)["job_id"]

    followed = run_sluice(logs_stack.url, "logs", api, job_id, "--follow")

    assert followed.returncode == 0, followed.stderr
    assert logs_client.job(api, job_id)["status"] in TERMINAL_STATUSES
    printed = followed.stdout.splitlines()
    for n in range(8):
        [line] = [text for text in printed if text.endswith(f' item {n} {{"item":{n}}}')]
        assert "INFO" in line and "batch_index=" in line and "pid=" in line
    assert any(' job complete {"succeeded":8}' in text for text in printed)

    as_json = run_sluice(logs_stack.url, "logs", api, job_id, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    objects = [json.loads(text) for text in as_json.stdout.splitlines()]
    assert sorted(o["item"] for o in objects if "item" in o) == list(range(8))
    assert {o["labels"]["job_id"] for o in objects} == {job_id}


def test_a_job_keeps_only_about_its_bound_of_newest_lines(logs_client, tmp_path):
    api = _deploy(logs_client, tmp_path, "BatchAPI", BATCH_PREDICTOR)
    job_id = logs_client.submit(api, list(range(1000)), batch_size=1000, workers=1)["job_id"]
    logs_client.wait_job(api, job_id, timeout=180)

    lines = wait_for(lambda: (found := all_lines(logs_client, api, job_id)) and
                     found[-1]["message"] == "job complete" and found, "the completion's line")

    # `MAXLEN ~` trims whole stream nodes of 100 lines: at least the bound, at most a node more.
    assert LOG_LINES <= len(lines) <= LOG_LINES + 100
    items = [line["item"] for line in lines if "item" in line]
    assert items == list(range(1000 - len(items), 1000))


def test_a_realtime_apis_replica_lines_are_read_through_the_api_and_followed_until_ctrl_c(
    logs_stack, logs_client, tmp_path,
):
    api = _deploy(logs_client, tmp_path, "RealtimeAPI", REALTIME_PREDICTOR)
    logs_client.wait_ready(api, timeout=120)
    output = tmp_path / "follow.out"
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_URL"}
    with open(output, "w") as out:
        follower = subprocess.Popen(sluice(logs_stack.url, "logs", api, "--follow"), stdout=out,
                                    stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        marker = uuid.uuid4().hex
        assert logs_client.predict(api, {"marker": marker}) == {"ok": True}

        lines = wait_for(lambda: [line for line in all_lines(logs_client, api)
                                  if line.get("payload") == {"marker": marker}], "the request's line")
        wait_for(lambda: marker in output.read_text(), "the followed line")
    finally:
        follower.send_signal(signal.SIGINT)
        _, stderr = follower.communicate(timeout=30)

    [line] = lines
    assert line["message"] == "predicting" and line["labels"]["api"] == api and line["labels"]["request_id"]
    assert any(other["message"] == "loaded the model" for other in all_lines(logs_client, api))
    assert follower.returncode == 0 and "Traceback" not in stderr, stderr
    once = run_sluice(logs_stack.url, "logs", api)
    assert once.returncode == 0 and f'predicting {{"payload":{{"marker":"{marker}"}}}}' in once.stdout


def test_logs_explains_itself_with_help():
    result = run_sluice("http://127.0.0.1:1", "logs", "--help")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: ") and "logs [OPTIONS] API [JOB_ID]" in result.stdout
    assert "--follow" in result.stdout and "-o, --output" in result.stdout


PRINTING_PREDICTOR = '''
import sys

from cortex_internal.lib.log import logger


class PythonPredictor:
    def __init__(self, config, job_spec=None):
        print("built, as Cortex predictors say it")

    def predict(self, payload, batch_id=None):
        logger.info("logged before")
        print("printed", payload)
        print("printed to stderr", file=sys.stderr)
        logger.info("logged after")
        return {"ok": True}
'''


def printed(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(line["message"], line["levelname"]) for line in lines if line["message"].startswith(("printed", "logged"))]


def test_a_batch_predictors_printed_lines_are_its_jobs_log_lines_in_order_with_its_labels(logs_client, tmp_path):
    api = _deploy(logs_client, tmp_path, "BatchAPI", PRINTING_PREDICTOR)
    job_id = logs_client.submit(api, [7], batch_size=1, workers=1)["job_id"]
    assert logs_client.wait_job(api, job_id, timeout=180)["status"] == "status_succeeded"

    lines = wait_for(lambda: (found := all_lines(logs_client, api, job_id)) and
                     any(line["message"] == "logged after" for line in found) and found, "the batch's lines")

    assert printed(lines) == [("logged before", "INFO"), ("printed [7]", "INFO"), ("printed to stderr", "ERROR"),
                              ("logged after", "INFO")]
    [line] = [line for line in lines if line["message"] == "printed [7]"]
    assert line["labels"]["job_id"] == job_id and line["labels"]["batch_index"] == "0" and "@" in line["labels"]["node"]


def test_a_realtime_replicas_printed_lines_are_its_apis_log_lines(logs_client, tmp_path):
    api = _deploy(logs_client, tmp_path, "RealtimeAPI", PRINTING_PREDICTOR)
    logs_client.wait_ready(api, timeout=120)

    assert logs_client.predict(api, {"n": 1}) == {"ok": True}

    lines = wait_for(lambda: (found := all_lines(logs_client, api)) and
                     any(line["message"] == "logged after" for line in found) and found, "the request's lines")
    assert printed(lines) == [("logged before", "INFO"), ("printed {'n': 1}", "INFO"), ("printed to stderr", "ERROR"),
                              ("logged after", "INFO")]
    assert any(line["message"] == "built, as Cortex predictors say it" for line in lines)
    assert {line["labels"]["api"] for line in lines if line["message"].startswith("printed")} == {api}
    logs_client.delete_api(api, force=True)
