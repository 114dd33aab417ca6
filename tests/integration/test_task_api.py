"""A Cortex TaskAPI on the session's stack: deployed with the client, run through the public
address, the client and the CLI, its `Task` running once on a real worker node.

One API serves every test here (deployed once per module); each test's job tells its `Task` what
to do through the job's config, and the task leaves files behind so a test sees what ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from sluice.client import Client, ClientError
from testbed.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 120.0

TASK = '''
import json, os, time

from cortex_internal.lib.log import logger


class Task:
    def __call__(self, config):
        logger.info("task started", extra={"run": config["run"], "lr": config["lr"]})
        with open(config["started"], "w") as f:
            f.write(str(os.getpid()))
        if config.get("fail"):
            raise RuntimeError(f"no training data at {config['data']}")
        if config.get("hang"):
            time.sleep(300)
        with open(config["done"], "w") as f:
            json.dump({"config": config, "secret": os.environ.get("SECRET"), "cwd": os.getcwd()}, f)
        logger.info("task done", extra={"run": config["run"]})
'''


@pytest.fixture(scope="module")
def task_api(client: Client, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A TaskAPI deployed with `create_api` (Cortex's client call), from a project with a `.env`."""
    project = tmp_path_factory.mktemp("task-project")
    (project / "task.py").write_text(TASK)
    (project / ".env").write_text("SECRET=from-dotenv\n")
    name = f"task-{uuid.uuid4().hex[:8]}"
    [deployed] = client.create_api({"name": name, "kind": "TaskAPI", "compute": {"cpu": 1},
                                    "definition": {"path": "task.py", "config": {"lr": 0.1, "data": "s3://x/train"},
                                                   "env": {"MODE": "train"}}},
                                   project_dir=project)
    assert deployed["kind"] == "TaskAPI" and deployed["queue"] == "cpu"
    return name


def _config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    run = uuid.uuid4().hex[:8]
    return {"run": run, "started": str(tmp_path / f"{run}.started"), "done": str(tmp_path / f"{run}.done"), **extra}


def sluice(url: str, *args: str) -> subprocess.CompletedProcess:
    """`sluice --url URL ARGS...` as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_URL"}
    return subprocess.run([sys.executable, "-m", "sluice.cli", "--url", url, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=180)


def test_a_task_runs_once_with_the_merged_config_and_its_lines_go_to_the_jobs_stream(
    stack, client: Client, task_api: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, lr=0.5)
    answer = requests.post(f"{stack.url}/{task_api}", json={"config": config, "timeout": 300}, timeout=30)
    assert answer.status_code == 200, answer.text
    spec = answer.json()
    assert set(spec) == {"job_id", "api_name", "kind", "workers", "config", "timeout", "created_time"}
    assert (spec["kind"], spec["workers"], spec["timeout"]) == ("TaskAPI", 1, 300)
    job_id = spec["job_id"]

    waited = sluice(stack.url, "wait", task_api, job_id, "--timeout", str(WAIT_S), "-o", "json")

    assert waited.returncode == 0, waited.stderr
    final = json.loads(waited.stdout)
    assert (final["status"], final["kind"]) == ("status_succeeded", "TaskAPI")
    assert final["end_time"] is not None
    ran = json.loads(Path(config["done"]).read_text())
    assert ran["config"] == {**config, "lr": 0.5, "data": "s3://x/train"}  # the job's lr over the API's
    assert ran["secret"] == "from-dotenv"
    read = requests.get(f"{stack.url}/{task_api}", params={"jobID": job_id}, timeout=30).json()
    assert read["job_status"]["status"] == "status_succeeded" and read["api_spec"]["kind"] == "TaskAPI"
    assert read["api_spec"]["definition"]["path"] == "task.py" and "predictor" not in read["api_spec"]
    assert read["endpoint"].endswith(f"/{task_api}")

    lines = wait_for(lambda: [line for line in client.get_logs(task_api, job_id)["lines"]
                              if line.get("run") == config["run"]], 30, "the task's log lines")
    messages = [line["message"] for line in lines]
    assert messages[0] == "task started" and lines[0]["lr"] == 0.5
    assert {line["labels"]["job_id"] for line in lines} == {job_id}
    wait_for(lambda: len([line for line in client.get_logs(task_api, job_id)["lines"]
                          if line.get("run") == config["run"]]) == 2, 30, "the task's last line")
    logged = sluice(stack.url, "logs", task_api, job_id)
    assert logged.returncode == 0 and "task started" in logged.stdout and "task done" in logged.stdout
    described = sluice(stack.url, "get", task_api, job_id)
    assert described.returncode == 0, described.stderr
    assert f"job {job_id} of {task_api} (TaskAPI): succeeded" in described.stdout
    listed = sluice(stack.url, "get", task_api)
    assert listed.returncode == 0 and job_id in listed.stdout and "succeeded" in listed.stdout


def test_a_task_that_raises_ends_with_a_worker_error_carrying_its_message(
    stack, client: Client, task_api: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, fail=True)

    submitted = sluice(stack.url, "submit", task_api, "--config", json.dumps(config), "--wait", "-o", "json")

    assert submitted.returncode != 0
    assert "ended worker_error" in submitted.stderr and "no training data" in submitted.stderr
    final = json.loads(submitted.stdout)
    assert (final["kind"], final["status"]) == ("TaskAPI", "status_worker_error")
    assert "RuntimeError: no training data at s3://x/train" in final["message"]
    assert client.job(task_api, final["job_id"])["message"] == final["message"]
    assert Path(config["started"]).exists() and not Path(config["done"]).exists()


def test_a_task_past_its_timeout_is_timed_out_and_a_stopped_one_is_stopped(
    client: Client, task_api: str, tmp_path: Path
) -> None:
    timed = _config(tmp_path, hang=True)
    stopped = _config(tmp_path, hang=True)
    timed_id = client.submit_task(task_api, config=timed, timeout=2)["job_id"]
    stopped_id = client.submit_task(task_api, config=stopped)["job_id"]
    wait_for(lambda: Path(stopped["started"]).exists(), WAIT_S, "the task to be stopped to start")

    assert client.stop(task_api, stopped_id) == {"message": f"stopped job {stopped_id}"}
    with pytest.raises(ClientError) as again:
        client.stop(task_api, stopped_id)
    assert again.value.http_status == 409

    assert client.wait(task_api, timed_id, timeout=WAIT_S)["status"] == "status_timed_out"
    assert client.job(task_api, stopped_id)["status"] == "status_stopped"
    # The nodes running them ended the tasks (their processes, which the stack starts again).
    for started in (stopped["started"], timed["started"]):
        if Path(started).exists():  # a task timed out before a node took it never started
            pid = int(Path(started).read_text())
            wait_for(lambda pid=pid: not _alive(pid), WAIT_S, f"the node process {pid} running a task to end")
    assert not Path(timed["done"]).exists() and not Path(stopped["done"]).exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1]
    except FileNotFoundError:
        return False
    return not state.startswith("Z")  # a zombie has ended


def test_bad_task_configs_and_submissions_are_refused_naming_the_field(
    stack, client: Client, task_api: str, tmp_path: Path
) -> None:
    answer = requests.post(f"{stack.url}/tasks/{task_api}", json={"timeout": 0, "config": {}}, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["kind"] == "bad_request" and "timeout: must be from 1 to" in answer.json()["message"]
    answer = requests.post(f"{stack.url}/{task_api}", json={"config": "lr=0.5"}, timeout=30)
    assert answer.status_code == 400 and answer.json()["message"].startswith("config:")
    assert requests.post(f"{stack.url}/tasks/no-such-api", json={}, timeout=30).status_code == 404

    (tmp_path / "task.py").write_text(TASK)
    with pytest.raises(ClientError) as refused:
        client.create_api({"name": f"bad-{uuid.uuid4().hex[:6]}", "kind": "TaskAPI",
                           "definition": {"path": "task.py", "models": {"path": "m/"}}}, project_dir=tmp_path)
    assert refused.value.http_status == 400 and "definition.models: unknown field" in refused.value.server_message
