"""The embedded stack places worker nodes as any worker host does (`sluice up` runs one this way).

Its nodes are kept by a worker-host agent: at least `--workers` of them, more while a job asks for
more `workers` and the stack's room allows, and those above the minimum stop after the idle grace.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import requests

from sluice.embedded import Stack, free_port
from testbed.wheels import GREETING, GREETING_MODULE
from tests.integration.conftest import FAST_LOOPS, ROOM, closing_client, read_events, write_project

pytestmark = pytest.mark.integration

IDLE_GRACE_S = 2.0
ENVIRONMENT_GRACE_S = 2.0


@pytest.fixture(scope="module")
def agent_stack(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path):
    data_dir = tmp_path_factory.mktemp("agent-stack")
    env = {**FAST_LOOPS, "SLUICE_FIND_LINKS": str(wheelhouse), "SLUICE_NO_INDEX": "1",
           "SLUICE_ENVIRONMENT_GRACE_S": str(ENVIRONMENT_GRACE_S)}
    with Stack(port=free_port(), offers=ROOM, workers=1, data_dir=data_dir, env=env, worker_host=True,
               idle_grace_s=IDLE_GRACE_S, realtime=False) as running:
        yield running
        print(running.logs())


def test_a_job_asking_three_workers_runs_on_three_nodes_that_stop_after_the_idle_grace(
        agent_stack: Stack, tmp_path: Path, events_file: Path) -> None:
    assert len(agent_stack.worker_nodes()) == 1
    client = closing_client(agent_stack.url)
    name = f"three-{uuid.uuid4().hex[:6]}"
    client.deploy(write_project(tmp_path / name, name, {"events": str(events_file), "sleep": 0.3}))
    spec = client.submit_job(name, {"workers": 3, "item_list": {"items": list(range(36)), "batch_size": 1},
                                    "config": {"events": str(events_file), "sleep": 0.3}})
    final = client.wait_job(name, spec["job_id"], timeout=180)
    assert final["status"] == "status_succeeded", final
    pids = {event["pid"] for event in read_events(events_file) if event.get("event") == "predict"}
    assert len(pids) == 3, pids  # three nodes took batches
    deadline = time.monotonic() + 60
    while len(agent_stack.worker_nodes()) > 1:  # the two extra ones stop once idle for the grace
        assert time.monotonic() < deadline, agent_stack.worker_nodes()
        time.sleep(0.5)


def test_a_worker_host_builds_a_deployed_apis_environment_ahead_and_removes_the_old_one_after_a_redeploy(
        agent_stack: Stack, tmp_path: Path) -> None:
    client = closing_client(agent_stack.url)
    name = f"warm-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / name
    config = write_project(folder, name, source=f"import {GREETING_MODULE}\n" + SIMPLE_PREDICTOR)
    root = agent_stack.data_dir / "cache" / "environments"  # type: ignore[operator]
    keys = []
    for version in ("1.0.0", "2.0.0"):
        (folder / "requirements.txt").write_text(f"{GREETING}=={version}\n")
        [deployed] = client.deploy(config)
        keys.append(deployed["environment"]["key"])
        deadline = time.monotonic() + 60
        while client.get_api(name)["environment"].get("state") != "ready":  # built with no job submitted
            assert time.monotonic() < deadline, client.get_api(name)["environment"]
            time.sleep(0.2)
        assert (root / keys[-1]).is_dir()
    deadline = time.monotonic() + 60
    while (root / keys[0]).exists():  # no API uses the old one: removed after its grace
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert (root / keys[1]).is_dir()


SIMPLE_PREDICTOR = """
class PythonPredictor:
    def __init__(self, config, job_spec):
        pass

    def predict(self, payload, batch_id):
        return None
"""


# -- memory ------------------------------------------------------------------------------------------
HUNGRY_BATCH_PREDICTOR = """
import json
import os


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.grow_mib = config.get("grow_mib", 0)
        self.events = config["events"]
        self.held = []

    def predict(self, payload, batch_id):
        for _ in range(self.grow_mib // 10):
            self.held.append(bytearray(10 * 1024 * 1024))
        with open(self.events, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "rss_mib": _rss_mib()}) + "\\n")


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1024 * 1024)
"""


@pytest.fixture(scope="module")
def watched_stack(tmp_path_factory: pytest.TempPathFactory):
    """A stack whose worker host holds its nodes' memory with the watchdog, as on a host without a
    writable control group."""
    data_dir = tmp_path_factory.mktemp("watched-stack")
    env = {**FAST_LOOPS, "SLUICE_MEMORY_LIMITS": "watchdog"}
    with Stack(port=free_port(), offers=ROOM, workers=1, data_dir=data_dir, env=env, worker_host=True,
               idle_grace_s=IDLE_GRACE_S, realtime=False) as running:
        yield running
        print(running.logs())


@pytest.mark.parametrize("limits", ["auto", "watchdog"])
def test_a_batch_predictor_past_its_compute_mem_ends_its_job_worker_oom_and_another_job_succeeds(
        request: pytest.FixtureRequest, limits: str, tmp_path: Path, events_file: Path) -> None:
    from foundation.cpu_limits import CpuLimits
    from foundation.memory_limits import NODE_MARGIN_BYTES
    from tests.integration.test_memory_limits import cpu_shares_of

    agent_stack: Stack = request.getfixturevalue("agent_stack" if limits == "auto" else "watched_stack")
    client = closing_client(agent_stack.url)
    names = {}
    for role, grow, cpu in (("hungry", 600, 1), ("calm", 0, "500m")):
        name = names[role] = f"{role}-{uuid.uuid4().hex[:6]}"
        folder = tmp_path / name
        write_project(folder, name, {"grow_mib": grow, "events": str(events_file)}, source=HUNGRY_BATCH_PREDICTOR,
                      compute={"cpu": cpu, "mem": "100Mi"})
        client.deploy(folder / "cortex.yaml")

    hungry = client.submit_job(names["hungry"], {"item_list": {"items": [1, 2], "batch_size": 1}})
    final = client.wait_job(names["hungry"], hungry["job_id"], timeout=180)
    assert final["status"] == "status_worker_oom", final
    message = final.get("message") or ""
    assert "a worker was stopped for memory running batch" in message, final
    limit_mib = (100 * 1024 * 1024 + NODE_MARGIN_BYTES) // (1024 * 1024)
    assert f"over its limit of {limit_mib} MiB" in message and "peak" in message, message  # the watchdog's too
    [failed] = client.failed_batches(names["hungry"], hungry["job_id"])  # with its items, for retry_failed_of
    assert failed["error"].startswith(f"out of memory: over its limit of {limit_mib} MiB"), failed
    assert failed["payload"] in ([1], [2])

    # The node was started again; another job on the same host runs, and Sluice's own part of a node
    # after a batch stays within the margin it is given.
    events_file.write_text("")
    calm = client.submit_job(names["calm"], {"item_list": {"items": [1, 2, 3], "batch_size": 1}})
    assert client.wait_job(names["calm"], calm["job_id"], timeout=180)["status"] == "status_succeeded"
    rows = [json.loads(line) for line in events_file.read_text().splitlines()]
    assert len(rows) == 3 and max(row["rss_mib"] for row in rows) * 1024 * 1024 < NODE_MARGIN_BYTES, rows
    # The node ran the calm job's batches with its compute.cpu as its weight (where cgroup v1's cpu
    # controller is writable, as on these hosts).
    if CpuLimits.from_env({}).version == 1:
        assert {cpu_shares_of(row["pid"]) for row in rows} == {512}
    assert requests.get(f"{agent_stack.url}/healthz", timeout=10).status_code == 200
