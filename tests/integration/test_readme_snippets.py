"""The snippets of the README and docs/ marked `run` (tests/readme_snippets.py), run as a reader would on a
`sluice up` stack: shell lines one by one in a copy of the examples, Python blocks as scripts.

What a reader fills in is filled in here: the stack's address for `http://127.0.0.1:8888`, the
newest job of the API named on the line for `<job_id>`. The stack itself stands for `sluice up`,
and an API a block uses without deploying it (the AsyncAPI `summarise`) is deployed first.
Every line must succeed; the one refusal a reader meets on purpose (`stop` of a job that has
already ended) must say so.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from foundation.replica_directory import RedisReplicaDirectory
from sluice.client import ApiNotFound, Client
from sluice.embedded import Stack
from testbed.waiting import wait_for
from tests.readme_snippets import Snippet, all_snippets

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
README_URL = "http://127.0.0.1:8888"
# Lines the stack stands for: it is running already, in this test's own environment.
LEFT_TO_THE_STACK = (". .venv/bin/activate", "sluice up")
# A refusal a reader may meet on purpose, and the words that must explain it.
EXPECTED_REFUSALS = {"sluice stop": "already ended"}
# The README's AsyncAPI example calls an API it does not deploy: this one stands for it.
SUMMARISE = '''
class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload):
        return {"summary": payload["text"][:20]}
'''


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reader's checkout: the examples, with the models `make demo` trains."""
    tmp_path = tmp_path_factory.mktemp("reader")
    shutil.copytree(ROOT / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("model.pkl", "models", "__pycache__"))
    subprocess.run([sys.executable, "examples/iris-batch/train.py"], cwd=tmp_path, check=True, capture_output=True,
                   timeout=300)
    return tmp_path


def _environment(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_URL", "SLUICE_API_KEY")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SLUICE_URL"] = stack.url
    return env


def _job_of_the_line(client: Client, line: str) -> str:
    """The newest job of the API the line names (`API <job_id>` or `/API?jobID=<job_id>`)."""
    found = re.search(r"([\w-]+)\s+<job_id>", line) or re.search(r"/([\w-]+)(?:/failed)?\?jobID=<job_id>", line)
    assert found, f"which API's job does this line mean? {line}"
    jobs = client.jobs(found.group(1))
    assert jobs, f"no job of {found.group(1)} for: {line}"
    return jobs[0]["job_id"]


def _run_line(line: str, cwd: Path, env: dict[str, str], client: Client, url: str) -> str:
    command = line.replace(README_URL, url)
    if "<job_id>" in command:
        command = command.replace("<job_id>", _job_of_the_line(client, line))
    deadline = time.monotonic() + 90
    while True:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        # A realtime API answers not_ready until its replica is up: a reader tries again.
        if command.startswith("curl") and "not_ready" in done.stdout and time.monotonic() < deadline:
            time.sleep(0.5)
            continue
        break
    refusal = next((words for start, words in EXPECTED_REFUSALS.items() if line.startswith(start)), None)
    if done.returncode != 0 and refusal is not None:
        assert refusal in done.stderr, (line, done.stderr)
        return done.stderr
    assert done.returncode == 0, f"README line failed: {line}\n{done.stdout}\n{done.stderr}"
    assert "internal_error" not in done.stdout, (line, done.stdout)
    return done.stdout


def _deploy_summarise(client: Client, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(SUMMARISE)
    api = {"name": "summarise", "kind": "AsyncAPI", "predictor": {"type": "python", "path": "predictor.py"}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api]))
    client.deploy(folder / "cortex.yaml")


def _run(snippet: Snippet, reader: Path, stack: Stack, client: Client) -> str:
    env = _environment(stack)
    if snippet.language == "python":
        if '"summarise"' in snippet.text:
            _deploy_summarise(client, reader / "summarise")
        done = subprocess.run([sys.executable, "-c", snippet.text], cwd=reader, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{snippet.where}\n{done.stderr}"
        return done.stdout
    if "iris-batch" in snippet.text and "sluice deploy examples/iris-batch" not in snippet.text:
        client.deploy(reader / "examples/iris-batch/cortex.yaml")  # a block that calls the API deployed above
    return "".join(_run_line(line, reader, env, client, stack.url) for line in snippet.commands()
                   if not line.startswith(LEFT_TO_THE_STACK))


RUN = [s for s in all_snippets() if s.runs]
# The APIs the snippets deploy under the names the docs give; other modules on the same stack may
# deploy the same examples (tests/integration/test_realtime_examples.py).
DEPLOYED_BY_THE_SNIPPETS = ("iris-batch", "iris-realtime", "summarise")


@pytest.fixture(scope="module", autouse=True)
def leave_the_stack_as_found(stack: Stack, client: Client):
    """Delete what the snippets deployed, and wait until no replica of theirs is left serving."""
    yield
    replicas = RedisReplicaDirectory(redis.Redis.from_url(stack.redis_url or ""))
    for name in DEPLOYED_BY_THE_SNIPPETS:
        with contextlib.suppress(ApiNotFound):
            client.delete_api(name, force=True)
    wait_for(lambda: not any(replicas.live(time.time(), name) for name in DEPLOYED_BY_THE_SNIPPETS), 60,
             "the snippets' replicas to stop")


@pytest.mark.parametrize("snippet", RUN, ids=lambda s: s.where)
def test_the_readme_snippet_runs_as_written(snippet: Snippet, reader: Path, stack: Stack, client: Client) -> None:
    printed = _run(snippet, reader, stack, client)
    # Each block shows what a reader came for.
    if "sluice submit iris-batch" in snippet.text:
        assert '"status": "status_succeeded"' in printed and "deleted api iris-batch" in printed, printed
    elif "curl -X POST http://127.0.0.1:8888/iris-batch" in snippet.text:
        assert '"job_id"' in printed and '"batch_metrics"' in printed, printed
    elif "iris-realtime" in snippet.text:
        assert re.search(r"setosa|versicolor|virginica", printed), printed
    elif "submit_async" in snippet.text:
        assert printed.strip() == str({"summary": "..."}), printed
