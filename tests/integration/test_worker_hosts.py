"""A batch job gets the `workers` it asks for, and an AsyncAPI the nodes its scaler wants: a worker
host's agent (`sluice workers`) starts more nodes when a job or an AsyncAPI wants them and the host
has room, stops them once idle, and a job that cannot have them says why (real redis-server, beat,
API and Celery nodes the agent starts)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import requests
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from foundation import keys
from sluice.cli import main
from sluice.client import Client
from sluice.embedded import Stack, free_port
from testbed.waiting import wait_for

from .conftest import FAST_LOOPS, closing_client, read_events, write_project

pytestmark = pytest.mark.integration

# Each batch logs its process, then waits until the test lets it go: until 3 processes have logged
# (`until_pids`), or until a file exists (`until_file`); at most a minute either way.
GATED_PREDICTOR = '''
import json, os, time


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config

    def _pids(self):
        with open(self.config["events"]) as f:
            return {json.loads(line)["pid"] for line in f}

    def predict(self, payload, batch_id):
        with open(self.config["events"], "a") as f:
            f.write(json.dumps({"event": "predict", "pid": os.getpid(), "batch_id": batch_id}) + "\\n")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "until_pids" in self.config and len(self._pids()) >= self.config["until_pids"]:
                return
            if "until_file" in self.config and os.path.exists(self.config["until_file"]):
                return
            time.sleep(0.1)
'''


# One host pool declared to beat, as the Helm chart declares its pools: hosts of 2 cpu.
POOLS = {"SLUICE_HOST_POOLS": json.dumps([{"name": "workers-cpu", "role": "workers", "hardware": "cpu", "cpu": "2"}])}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Redis, the API and beat, and no worker node of its own: the agents under test bring them."""
    with Stack(port=free_port(), workers=0, proxy=False, realtime=False, supervise=False,
               data_dir=tmp_path_factory.mktemp("worker-hosts"), env={**FAST_LOOPS, **POOLS}) as running:
        yield running
        print(running.logs())


@pytest.fixture
def client(stack: Stack) -> Client:
    return closing_client(stack.url)


@pytest.fixture
def redis_client(stack: Stack) -> redis.Redis:
    return redis.Redis.from_url(stack.redis_url or "", decode_responses=True)


@pytest.fixture
def agent(stack: Stack, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start `sluice workers` with these options under a fresh host id; returns the id. Stopped after the test."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*options: str) -> str:
        host_id = f"it-{uuid.uuid4().hex[:6]}"
        log_path = tmp_path / f"{host_id}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "workers", "--queues", "cpu", "--host-id", host_id, *options],
                stdout=log, stderr=subprocess.STDOUT, env=stack._child_env(), cwd=stack.data_dir)
        started.append((process, log_path))
        return host_id

    yield start
    for process, log_path in started:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=90)
        print(f"----- {log_path.name} -----\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-30:]))


def nodes_of(redis_client: redis.Redis, host_id: str) -> list[str]:
    """The host's nodes alive in the node registry (each heartbeats until its warm shutdown ends)."""
    return sorted(n for n in redis_client.hkeys(keys.NODES) if n.startswith(f"{host_id}-"))


def deploy(client: Client, tmp_path: Path, events: Path, **config: object) -> str:
    api = f"w-{uuid.uuid4().hex[:8]}"
    client.deploy(write_project(tmp_path / api, api, {"events": str(events), **config}, source=GATED_PREDICTOR,
                                compute={"cpu": 1}))
    return api


@pytest.mark.slow
def test_a_job_asking_for_three_workers_on_a_host_started_with_one_node_runs_on_three_then_they_stop(
    client: Client, agent: Callable[..., str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    host_id = agent("--min-nodes", "1", "--cpu", "4", "--idle-grace", "2")
    wait_for(lambda: len(nodes_of(redis_client, host_id)) == 1, 60, "the agent's first node")
    events = tmp_path / "events.jsonl"
    events.touch()
    api = deploy(client, tmp_path, events, until_pids=3)

    job = client.submit(api, list(range(6)), batch_size=1, workers=3)
    final = client.wait(api, job["job_id"], timeout=120)

    assert final["status"] == "status_succeeded"
    predicts = [e for e in read_events(events) if e["event"] == "predict"]
    assert len(predicts) == 6
    assert len({e["pid"] for e in predicts}) == 3  # three nodes, each one predictor process
    wait_for(lambda: len(nodes_of(redis_client, host_id)) == 1, 60, "the idle extra nodes' warm shutdown")
    report = json.loads(redis_client.hget(keys.WORKER_HOSTS, host_id) or "{}")
    assert report["nodes"] == [f"{host_id}-1@{report['nodes'][0].split('@')[1]}"]


@pytest.mark.slow
def test_a_host_with_room_for_one_node_starts_no_other_and_the_job_says_why(
    client: Client, agent: Callable[..., str], redis_client: redis.Redis, stack: Stack, tmp_path: Path
) -> None:
    host_id = agent("--min-nodes", "1", "--cpu", "1", "--idle-grace", "2")
    wait_for(lambda: len(nodes_of(redis_client, host_id)) == 1, 60, "the agent's only node")
    events, release = tmp_path / "events.jsonl", tmp_path / "release"
    events.touch()
    api = deploy(client, tmp_path, events, until_file=str(release))

    job = client.submit(api, list(range(3)), batch_size=1, workers=3)
    why = "running on 1 of 3 workers: no host has room for 2 more nodes of 1 cpu"
    # Placement writes the note as it places the job, which may be before the job runs (still enqueuing).
    status = wait_for(lambda: (s := client.job(api, job["job_id"])).get("workers_note") == why
                      and s["status"] == "status_running" and s, 30, "the running job's note on its missing workers")
    shown = CliRunner().invoke(main, ["--url", stack.url, "get", api, job["job_id"]])
    release.touch()

    assert status["worker_counts"]["running"] == 1
    assert why in shown.output
    assert client.wait(api, job["job_id"], timeout=60)["status"] == "status_succeeded"
    assert len({e["pid"] for e in read_events(events)}) == 1
    assert "workers_note" not in client.job(api, job["job_id"])


ASYNC_HANDLER = '''
import logging


class Handler:
    def handle_async(self, payload, request_id):
        logging.getLogger("echo").info("echoing %s", request_id)
        return {"echo": payload}
'''


@pytest.mark.slow
def test_an_async_api_at_zero_on_a_host_keeping_no_node_gets_one_for_a_request_then_gives_it_back(
    client: Client, agent: Callable[..., str], redis_client: redis.Redis, tmp_path: Path
) -> None:
    host_id = agent("--min-nodes", "0", "--cpu", "2", "--idle-grace", "1")
    name = f"a-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "handler.py").write_text(ASYNC_HANDLER)
    api = {"name": name, "kind": "AsyncAPI", "predictor": {"type": "python", "path": "handler.py"},
           "compute": {"cpu": 1}, "autoscaling": {"min_replicas": 0, "window": "10s",
                                                  "downscale_stabilization_period": "0s"}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    assert client.api(name)["nodes"] == [] and nodes_of(redis_client, host_id) == []

    request_id = client.submit_async(name, {"n": 1})
    done = client.wait_async(name, request_id, timeout=90)

    assert done["status"] == "completed" and done["result"] == {"echo": {"n": 1}}
    assert [n.split("@")[0] for n in nodes_of(redis_client, host_id)] == [f"{host_id}-1"]
    wait_for(lambda: nodes_of(redis_client, host_id) == [], 60, "the node stopped once the api scaled back to 0")


def host_figures(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`/metrics`' host figures: (name, labels) -> value."""
    text = requests.get(f"{stack.url}/metrics", timeout=10).text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith(("sluice_host_pool", "sluice_unplaced"))}


def pool_shows(stack: Stack, wanted: int, busy: int, idle: int, unplaced: int) -> bool:
    figures = host_figures(stack)
    return (figures.get(("sluice_host_pool_wanted", (("pool", "workers-cpu"),))) == wanted
            and figures.get(("sluice_host_pool_hosts", (("pool", "workers-cpu"), ("state", "busy")))) == busy
            and figures.get(("sluice_host_pool_hosts", (("pool", "workers-cpu"), ("state", "idle")))) == idle
            and figures.get(("sluice_unplaced", (("hardware", "cpu"), ("role", "workers"))), 0) == unplaced)


@pytest.mark.slow
def test_a_host_pool_wants_the_hosts_a_job_needs_from_zero_and_none_once_it_is_done(
    client: Client, agent: Callable[..., str], stack: Stack, tmp_path: Path
) -> None:
    # What KEDA does on Kubernetes, the test does by hand: it starts a host of the pool when the
    # figure asks for more than run. Each host offers 2 cpu; each node takes 1.
    events, release = tmp_path / "events.jsonl", tmp_path / "release"
    events.touch()
    api = deploy(client, tmp_path, events, until_file=str(release))
    assert wait_for(lambda: pool_shows(stack, wanted=0, busy=0, idle=0, unplaced=0), 30, "an idle pool wanting none")

    job = client.submit(api, list(range(4)), batch_size=1, workers=3)
    wait_for(lambda: pool_shows(stack, wanted=2, busy=0, idle=0, unplaced=3), 30,
             "3 nodes of 1 cpu unplaced: 2 hosts of 2 cpu wanted")

    agent("--pool", "workers-cpu", "--cpu", "2", "--min-nodes", "0", "--idle-grace", "1")
    wait_for(lambda: client.job(api, job["job_id"])["worker_counts"]["running"] == 2, 60, "the first host's 2 nodes")
    wait_for(lambda: pool_shows(stack, wanted=2, busy=1, idle=0, unplaced=1), 30, "one busy host, one node unplaced")

    agent("--pool", "workers-cpu", "--cpu", "2", "--min-nodes", "0", "--idle-grace", "1")
    wait_for(lambda: client.job(api, job["job_id"])["worker_counts"]["running"] == 3, 60, "the second host's node")
    wait_for(lambda: pool_shows(stack, wanted=2, busy=2, idle=0, unplaced=0), 30, "two busy hosts, nothing unplaced")

    release.touch()
    assert client.wait(api, job["job_id"], timeout=60)["status"] == "status_succeeded"
    wait_for(lambda: pool_shows(stack, wanted=0, busy=0, idle=2, unplaced=0), 60,
             "both hosts idle once their nodes stopped: the pool wants none (scale to zero)")
