"""Jobs of different APIs on one worker node each see only their own env, import path and modules.

A node is one long-lived process that runs job after job. Two APIs here ship a `.env` of their
own and a `helpers.py` of the same name; whatever ran before on the node, each job's predictor
must see its own, and a redeployed `helpers.py` must be what the next job runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.client import Client
from sluice.embedded import Stack

from .conftest import closing_client

pytestmark = pytest.mark.integration

# Every call leaves a line saying what the predictor saw of the process.
PREDICTOR = '''
import json, os, sys

import helpers


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config
        self.job_id = job_spec["job_id"]
        self.at_import = helpers.VALUE
        self._log("init")

    def _log(self, event):
        import helpers as now  # looked up again: the module this call would import
        record = {
            "event": event, "job_id": self.job_id, "pid": os.getpid(), "cwd": os.getcwd(),
            "helpers": now.VALUE, "helpers_at_import": self.at_import, "helpers_file": now.__file__,
            "ONLY_A": os.environ.get("ONLY_A"), "ONLY_B": os.environ.get("ONLY_B"),
            "bundles_on_path": [p for p in sys.path if "bundles" in p],
        }
        with open(self.config["events"], "a") as f:
            f.write(json.dumps(record) + "\\n")

    def predict(self, payload, batch_id):
        self._log("predict")

    def on_job_complete(self):
        self._log("complete")
'''


@pytest.fixture(scope="module")
def one_node(one_node_stack: Stack) -> Client:
    """The session's stack with a single worker node, so every job runs in the same process."""
    return closing_client(one_node_stack.url)


def deploy(client: Client, folder: Path, api_name: str, env_line: str, helpers_value: str, events: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(PREDICTOR)
    (folder / ".env").write_text(env_line + "\n")
    (folder / "helpers.py").write_text(f"VALUE = {helpers_value!r}\n")
    api = {"name": api_name, "kind": "BatchAPI", "compute": {"cpu": 1},
           "predictor": {"type": "python", "path": "predictor.py", "config": {"events": str(events)}}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")


def run_job(client: Client, api_name: str) -> str:
    spec = client.submit(api_name, [1, 2, 3], batch_size=1, workers=1)
    final = client.wait(api_name, spec["job_id"], timeout=120)
    assert final["status"] == "status_succeeded", final
    return spec["job_id"]


def seen_by(events: Path, job_id: str) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    return [r for r in records if r["job_id"] == job_id]


def test_jobs_of_two_apis_on_one_node_see_only_their_own_env_and_helpers_and_a_redeploy_runs_new_code(
    one_node: Client, tmp_path: Path
) -> None:
    client, events = one_node, tmp_path / "events.jsonl"
    deploy(client, tmp_path / "a", "iso-a", "ONLY_A=1", "a, first deploy", events)
    deploy(client, tmp_path / "b", "iso-b", "ONLY_B=1", "b", events)

    first_a, then_b, again_a = run_job(client, "iso-a"), run_job(client, "iso-b"), run_job(client, "iso-a")
    deploy(client, tmp_path / "a-changed", "iso-a", "ONLY_A=1", "a, second deploy", events)
    redeployed_a = run_job(client, "iso-a")

    jobs = {job_id: seen_by(events, job_id) for job_id in (first_a, then_b, again_a, redeployed_a)}
    assert all(len(records) == 5 for records in jobs.values()), jobs  # init, 3 batches, complete
    assert len({r["pid"] for records in jobs.values() for r in records}) == 1, "all ran in one process"
    expected = {
        first_a: ("a, first deploy", "1", None),
        then_b: ("b", None, "1"),
        again_a: ("a, first deploy", "1", None),
        redeployed_a: ("a, second deploy", "1", None),
    }
    for job_id, records in jobs.items():
        for record in records:
            assert (record["helpers"], record["ONLY_A"], record["ONLY_B"]) == expected[job_id], record
            assert record["helpers_at_import"] == record["helpers"]
            assert record["bundles_on_path"] == [record["cwd"]], record  # its own folder, no other API's
            assert Path(record["helpers_file"]).parent == Path(record["cwd"])
    assert jobs[first_a][0]["cwd"] == jobs[again_a][0]["cwd"] != jobs[then_b][0]["cwd"]
    assert jobs[redeployed_a][0]["cwd"] != jobs[first_a][0]["cwd"]  # a new bundle, in a folder of its own
