"""The `sluice` command as a user runs it: a subprocess against a live stack, its output and exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sluice.client import Client

from .conftest import write_project

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

COMMANDS = ["version", "deploy", "get", "submit", "wait", "stop", "predict", "delete", "up", "serve", "replicas",
            "proxy", "logs", "status", "jobs", "apis"]

REALTIME_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload):
        return {"echo": payload}
'''


def sluice(*args: str, url: str | None = None, env: dict[str, str] | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `sluice [--url URL] ARGS...` as a user would."""
    base = {k: v for k, v in os.environ.items() if k != "SLUICE_URL"}
    argv = [sys.executable, "-m", "sluice.cli", *(["--url", url] if url else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, env={**base, **(env or {})}, cwd=ROOT,
                          timeout=timeout)


def failed_with_one_line(result: subprocess.CompletedProcess) -> str:
    """The reason of a failed command: non-zero, one `error: ...` line on stderr, no traceback."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _name() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def batch_api(stack, tmp_path, events_file) -> str:
    name = _name()
    config = write_project(tmp_path / name, name, {"events": str(events_file)})
    deployed = sluice("deploy", str(config), url=stack.url)
    assert deployed.returncode == 0, deployed.stderr
    assert f"deployed {name} (BatchAPI" in deployed.stdout
    return name


def _submission(tmp_path: Path, items: list, batch_size: int, **extra) -> Path:
    path = tmp_path / f"job-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"workers": 1, "item_list": {"items": items, "batch_size": batch_size}, **extra}))
    return path


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself_with_help(command):
    result = sluice(command, "--help")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: ") and command in result.stdout.splitlines()[0]


def test_version_prints_the_version_and_json_for_scripts():
    assert sluice("version").stdout.startswith("sluice ")
    assert "client_version" in json.loads(sluice("version", "-o", "json").stdout)


def test_a_job_is_submitted_from_a_file_waited_for_and_described(stack, batch_api, tmp_path):
    submitted = sluice("submit", batch_api, str(_submission(tmp_path, list(range(6)), 2)), url=stack.url)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]

    waited = sluice("wait", batch_api, job_id, url=stack.url)

    assert waited.returncode == 0, waited.stderr
    assert f"job {job_id}: succeeded (3 succeeded, 0 failed of 3 batches)" in waited.stdout
    assert waited.stderr == ""  # no progress bar when stderr is not a terminal

    listed = json.loads(sluice("get", "-o", "json", url=stack.url).stdout)
    [row] = [r for r in listed if r["name"] == batch_api]
    assert (row["kind"], row["status"], row["jobs_running"]) == ("BatchAPI", "live", 0)
    table = sluice("get", url=stack.url)
    assert table.returncode == 0 and batch_api in table.stdout and "0 running" in table.stdout

    api = sluice("get", batch_api, url=stack.url)
    assert api.returncode == 0 and job_id in api.stdout and "3/0/3" in api.stdout and "succeeded" in api.stdout
    assert f"endpoint: {stack.url}/{batch_api}\n" in api.stdout
    listed = json.loads(sluice("get", batch_api, "-o", "json", url=stack.url).stdout)["jobs"]
    assert [j["job_id"] for j in listed] == [job_id]

    # Cortex's shape (`cortex get API JOB_ID -o json`), with Sluice's extras beside it.
    job = json.loads(sluice("get", batch_api, job_id, "-o", "json", url=stack.url).stdout)
    assert set(job) == {"job_status", "endpoint", "api_spec", "failed_batches", "output_location"}
    assert job["job_status"]["status"] == "status_succeeded" and job["job_status"]["batch_metrics"]["succeeded"] == 3
    assert job["job_status"]["job_id"] == job_id and job["api_spec"]["name"] == batch_api
    assert job["endpoint"].startswith(stack.url) and job["endpoint"].endswith(f"/{batch_api}")
    assert job["failed_batches"] == [] and job["output_location"] is None
    described = sluice("get", batch_api, job_id, url=stack.url)
    assert "3 succeeded, 0 failed, 3 total" in described.stdout
    # One spelling of a status in every line a person reads: the list's, the job's, wait's.
    assert f"job {job_id} of {batch_api}: succeeded" in described.stdout
    assert "status_" not in described.stdout + api.stdout + waited.stdout

    # The first CLI's spellings still work.
    assert json.loads(sluice("status", batch_api, job_id, url=stack.url).stdout)["status"] == "status_succeeded"
    assert job_id in sluice("jobs", batch_api, url=stack.url).stdout
    assert batch_api in sluice("apis", url=stack.url).stdout


def test_wait_on_a_job_with_failed_batches_exits_non_zero_and_get_shows_them(stack, tmp_path, events_file):
    name = _name()
    config = write_project(tmp_path / name, name, {"events": str(events_file), "poison": 3})
    assert sluice("deploy", str(config), "-o", "json", url=stack.url).returncode == 0
    items = tmp_path / "items.json"
    items.write_text(json.dumps(list(range(6))))
    submitted = sluice("submit", name, "--items", str(items), "--batch-size", "2", url=stack.url)
    job_id = json.loads(submitted.stdout)["job_id"]

    waited = sluice("wait", name, job_id, url=stack.url)

    assert failed_with_one_line(waited).startswith(f"error: job {job_id} ended completed_with_failures")
    assert f"job {job_id}: completed_with_failures (2 succeeded, 1 failed of 3 batches)" in waited.stdout
    job = json.loads(sluice("get", name, job_id, "-o", "json", url=stack.url).stdout)
    assert job["job_status"]["batch_metrics"] == {**job["job_status"]["batch_metrics"], "succeeded": 2, "failed": 1}
    assert [b["index"] for b in job["failed_batches"]] == [1]
    described = sluice("get", name, job_id, url=stack.url)
    assert "failed batches" in described.stdout and "cannot handle item 3" in described.stdout


def test_submit_with_wait_exits_non_zero_unless_the_job_succeeds(stack, tmp_path, events_file):
    name = _name()
    write_project(tmp_path / name, name, {"events": str(events_file), "fail_init": True})
    assert sluice("deploy", str(tmp_path / name / "cortex.yaml"), url=stack.url).returncode == 0

    result = sluice("submit", name, "--body", str(_submission(tmp_path, [1, 2], 1)), "--wait", url=stack.url)

    reason = failed_with_one_line(result)
    assert "ended worker_error" in reason
    assert reason.endswith("RuntimeError: the model file is corrupt"), reason
    # One JSON document on stdout: the final job_status (its job_id and spec fields included).
    final = json.loads(result.stdout)
    assert final["api_name"] == name and final["status"] == "status_worker_error"


SLOW_TO_BUILD = '''
import time


class PythonPredictor:
    def __init__(self, config, job_spec):
        time.sleep(3)  # loading a large model

    def predict(self, payload, batch_id):
        return payload
'''


def in_a_terminal(argv: list[str], timeout: float = 120) -> tuple[int, str]:
    """Run a command with a pseudo-terminal as its stdout and stderr, as a person's shell would;
    its exit status and everything it drew, escape sequences removed."""
    import pty
    import re
    import select

    leader, follower = pty.openpty()
    env = {**{k: v for k, v in os.environ.items() if k != "SLUICE_URL"}, "TERM": "xterm", "COLUMNS": "160"}
    process = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, cwd=ROOT)
    os.close(follower)
    drawn = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the command ended and closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    code = process.wait(timeout=10)
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn.decode(errors="replace"))


def test_submit_wait_in_a_terminal_shows_what_the_job_waits_for_then_its_progress(stack, tmp_path):
    name = _name()
    config = write_project(tmp_path / name, name, source=SLOW_TO_BUILD)
    assert sluice("deploy", str(config), url=stack.url).returncode == 0

    code, drawn = in_a_terminal([sys.executable, "-m", "sluice.cli", "--url", stack.url, "submit", name,
                                 "--body", str(_submission(tmp_path, list(range(4)), 2)), "--wait"])

    assert code == 0, drawn
    # The three seconds the predictor takes to build are named, with the node building it.
    assert re.search(r"building the predictor on \S+@\S+", drawn), drawn
    assert "succeeded" in drawn and "2/2 batches" in drawn, drawn  # the bar, then the final job status
    assert '"status": "status_succeeded"' in drawn, drawn


def test_get_watch_shows_the_apis_again_until_ctrl_c(stack, batch_api):
    import signal

    watching = subprocess.Popen([sys.executable, "-m", "sluice.cli", "--url", stack.url, "get", "--watch",
                                 "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT)
    seen = ""
    while seen.count(batch_api) < 3:  # three looks, each listing the API
        line = watching.stdout.readline()
        assert line, watching.stderr.read()
        seen += line
    watching.send_signal(signal.SIGINT)
    assert watching.wait(timeout=30) == 0
    assert seen.count("(Ctrl-C stops)") >= 3
    refused = sluice("get", "--watch", "-o", "json", url=stack.url)
    assert refused.returncode == 2 and "scripts poll `sluice get -o json`" in refused.stderr


def _running_job(stack, tmp_path: Path, events_file: Path) -> tuple[str, str]:
    """A deployed API and a job of it that is running (and would run for half a minute)."""
    name = _name()
    config = write_project(tmp_path / name, name, {"events": str(events_file), "sleep": 1})
    assert sluice("deploy", str(config), url=stack.url).returncode == 0
    submitted = sluice("submit", name, str(_submission(tmp_path, list(range(30)), 1)), url=stack.url)
    job_id = json.loads(submitted.stdout)["job_id"]
    client = Client(stack.url)
    deadline = time.monotonic() + 60
    while client.job(name, job_id)["status"] != "status_running":
        assert time.monotonic() < deadline, "the job never ran"
        time.sleep(0.1)
    return name, job_id


def test_stop_stops_a_running_job_and_wait_then_fails(stack, tmp_path, events_file):
    name, job_id = _running_job(stack, tmp_path, events_file)

    stopped = sluice("stop", name, job_id, url=stack.url)

    assert stopped.returncode == 0 and stopped.stdout.strip() == f"stopped job {job_id}"
    assert "ended stopped" in failed_with_one_line(sluice("wait", name, job_id, url=stack.url))
    assert "already ended" in failed_with_one_line(sluice("stop", name, job_id, "-o", "json", url=stack.url))


def test_delete_with_a_job_id_stops_the_job_as_cortex_delete_did(stack, tmp_path, events_file):
    name, job_id = _running_job(stack, tmp_path, events_file)

    stopped = sluice("delete", name, job_id, "-o", "json", url=stack.url)

    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout) == {"message": f"stopped job {job_id}"}
    assert "ended stopped" in failed_with_one_line(sluice("wait", name, job_id, url=stack.url))
    assert "already ended" in failed_with_one_line(sluice("delete", name, job_id, url=stack.url))
    # The API itself is still there; `delete API` (no job id) still deletes it.
    assert json.loads(sluice("get", name, "-o", "json", url=stack.url).stdout)["name"] == name
    assert "--force" in failed_with_one_line(sluice("delete", name, job_id, "--force", url=stack.url))
    assert sluice("delete", name, url=stack.url).stdout.strip() == f"deleted api {name}"


def test_every_printing_command_prints_one_json_document_with_o_json(stack, batch_api, tmp_path):
    submission = str(_submission(tmp_path, list(range(4)), 2))

    spec = json.loads(sluice("submit", batch_api, submission, "-o", "json", url=stack.url).stdout)
    waited = json.loads(sluice("wait", batch_api, spec["job_id"], "-o", "json", url=stack.url).stdout)
    # With --wait, one document still: the final job_status (it carries the spec's fields).
    final = json.loads(sluice("submit", batch_api, submission, "--wait", "-o", "json", url=stack.url).stdout)
    described = sluice("submit", batch_api, submission, "-o", "table", url=stack.url)

    assert spec["api_name"] == batch_api and spec["total_batch_count"] == 2
    assert (waited["job_id"], waited["status"]) == (spec["job_id"], "status_succeeded")
    assert final["status"] == "status_succeeded" and final["job_id"] != spec["job_id"]
    assert final["batch_metrics"]["succeeded"] == 2 and final["api_name"] == batch_api
    assert described.returncode == 0 and described.stdout.startswith("submitted job ")
    assert f"to {batch_api}: 2 batches" in described.stdout
    for args in (["version"], ["get"], ["get", batch_api], ["get", batch_api, spec["job_id"]],
                 ["status", batch_api, spec["job_id"]], ["jobs", batch_api], ["apis"]):
        result = sluice(*args, "-o", "json", url=stack.url)
        assert result.returncode == 0, (args, result.stderr)
        assert json.loads(result.stdout), args
    listed = json.loads(sluice("jobs", batch_api, "-o", "json", url=stack.url).stdout)
    assert spec["job_id"] in [j["job_id"] for j in listed]


def test_failures_are_one_line_reasons_with_a_non_zero_exit(stack, tmp_path):
    assert failed_with_one_line(sluice("get", "no-such-api", url=stack.url)) == \
        "error: 404 api_not_found: api no-such-api is not deployed"
    assert failed_with_one_line(sluice("get", "no-such-api", "123", "-o", "json", url=stack.url)).startswith(
        "error: 404 api_not_found")
    assert failed_with_one_line(sluice("delete", "no-such-api", url=stack.url)).startswith("error: 404 api_not_found")
    assert "cannot reach Sluice at http://127.0.0.1:1" in failed_with_one_line(sluice("get", url="http://127.0.0.1:1"))
    assert "--batch-size" in failed_with_one_line(sluice("submit", "x", "--items", __file__, url=stack.url))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert "not valid JSON" in failed_with_one_line(sluice("submit", "x", str(bad), url=stack.url))
    assert failed_with_one_line(sluice("no-such-command"))


def test_the_url_comes_from_sluice_url_when_not_given(stack, batch_api):
    result = sluice("get", "-o", "json", env={"SLUICE_URL": stack.url})

    assert result.returncode == 0, result.stderr
    assert batch_api in [row["name"] for row in json.loads(result.stdout)]


def test_a_realtime_api_is_deployed_described_asked_and_deleted(stack, tmp_path):
    name = _name()
    (tmp_path / "predictor.py").write_text(REALTIME_PREDICTOR)
    (tmp_path / "cortex.yaml").write_text(json.dumps(
        [{"name": name, "kind": "RealtimeAPI", "predictor": {"type": "python", "path": "predictor.py"}}]))
    deployed = sluice("deploy", str(tmp_path / "cortex.yaml"), "-o", "json", url=stack.url)
    assert json.loads(deployed.stdout)[0]["name"] == name
    Client(stack.url).wait_ready(name, timeout=120)

    answered = sluice("predict", name, "--data", '{"x": 1}', url=stack.url)
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout) == {"echo": {"x": 1}}
    body = tmp_path / "body.json"
    body.write_text(json.dumps([1, 2]))
    assert json.loads(sluice("predict", name, "--json", str(body), url=stack.url).stdout) == {"echo": [1, 2]}
    as_json = sluice("predict", name, "--data", "plain text", "-o", "json", url=stack.url)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == {"echo": "plain text"}

    described = sluice("get", name, url=stack.url)
    assert described.returncode == 0, described.stderr
    assert f"endpoint: {stack.url}/{name}" in described.stdout and "replicas: 1/1 ready" in described.stdout
    view = json.loads(sluice("get", name, "-o", "json", url=stack.url).stdout)
    assert (view["replicas_ready"], view["replicas_wanted"], view["readiness"]["ready"]) == (1, 1, True)
    # Where placement put it, and what the scaler saw, in both forms.
    scaling = view["scaling"]
    assert (scaling["desired"], scaling["ready"], scaling["starting"], scaling["pending"]) == (1, 1, 0, 0)
    [(host, on_host)] = scaling["hosts"].items()
    assert on_host == {"desired": 1, "ready": 1}
    assert "scaling: 1 wanted, 1 ready, 0 starting, 0 pending;" in described.stdout
    assert "request(s) in flight at the scaler's last decision" in described.stdout
    assert f"  host {host}: 1 wanted, 1 ready" in described.stdout
    [row] = [r for r in json.loads(sluice("get", "-o", "json", url=stack.url).stdout) if r["name"] == name]
    assert (row["kind"], row["status"], row["replicas_ready"]) == ("RealtimeAPI", "live", 1)

    assert json.loads(sluice("delete", name, "-o", "json", url=stack.url).stdout)["message"] == f"deleted api {name}"
    assert "404 api_not_found" in failed_with_one_line(sluice("get", name, url=stack.url))


def test_wait_shows_a_live_progress_bar_on_a_terminal(stack, batch_api, tmp_path):
    submitted = sluice("submit", batch_api, str(_submission(tmp_path, list(range(8)), 2)), url=stack.url)
    job_id = json.loads(submitted.stdout)["job_id"]

    waited = sluice("wait", batch_api, job_id, url=stack.url, env={"TTY_COMPATIBLE": "1", "COLUMNS": "160"})

    assert waited.returncode == 0, waited.stderr
    assert job_id in waited.stderr and "4/4" in waited.stderr
    assert "batches/s" in waited.stderr and "eta" in waited.stderr
