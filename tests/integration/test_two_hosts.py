"""Sluice on two hosts: two Linux network namespaces joined by a veth pair stand in for two machines.

Host A (10.77.0.1) runs redis-server, the S3 server (moto), the management API, the proxy, beat,
one worker node and one replica of a realtime API; host B (10.77.0.2) runs one worker node and a
second replica (bound to every address, told none to advertise), and reaches everything on A at
A's address only: Redis for its queues, S3 for the deployed bundles and the job's output. Each
process also gets a UTS namespace of its own with the host's name, so `socket.gethostname()` (and
Celery's `%h`) says `host-a` or `host-b` as it would on two machines. The test itself looks on
from host A: its HTTP, Redis and S3 calls run on a thread that joined A's network namespace.

The story: the realtime API answers through the proxy from both hosts' replicas; a batch job's
batches run on both hosts; every process of host B is SIGKILLed mid-job, and the job still ends
on A with every item in its output exactly once and `on_job_complete` run once, while the proxy
stops sending realtime requests to the dead replica.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) for `ip netns add`; skipped with the reason
where that is refused. The namespace machinery is tests/integration/netns_hosts.py.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import yaml

from jobs.store import JobStore
from sluice.client import TERMINAL_STATUSES, Client

from .netns_hosts import ADDRESS_A, ADDRESS_B, Host, LookFrom, make_hosts, remove_hosts, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

REDIS_PORT, S3_PORT, API_PORT, PROXY_PORT, REPLICA_PORT = 6379, 5000, 8000, 8888, 9100
STARTUP_S = 90.0
JOB_DEADLINE_S = 90.0

ITEMS = list(range(60))
BATCH_SIZE = 2
BATCH_SLEEP_S = 0.25

# Short loops, so that beat notices host B's node gone (4 node TTLs of silence) within seconds.
LOOPS = {
    "SLUICE_BEAT_INTERVAL": "0.5",
    "SLUICE_HEARTBEAT_INTERVAL": "0.5",
    "SLUICE_NODE_TTL": "2",
    "SLUICE_MODEL_POLL_INTERVAL": "1",
    "SLUICE_ENQUEUE_STALE_AFTER": "30",
}

# One output row per item, naming the host that ran it; every run of a batch also leaves one line
# per item in a shared file (the namespaces share the file system), which shows re-runs.
BATCH_PREDICTOR = '''
import json, os, socket, time


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config
        self.job_id = job_spec["job_id"]

    def predict(self, payload, batch_id):
        time.sleep(self.config["sleep"])
        host = socket.gethostname()
        lines = "".join(json.dumps({"item": item, "host": host, "batch_id": batch_id, "pid": os.getpid()}) + "\\n"
                        for item in payload)
        with open(self.config["lines"], "a") as f:
            f.write(lines)
        return [{"item": item, "host": host} for item in payload]

    def on_job_complete(self):
        with open(self.config["completions"], "a") as f:
            f.write(json.dumps({"host": socket.gethostname(), "job_id": self.job_id}) + "\\n")
'''

# Answers with the host and replica that served the request.
REALTIME_PREDICTOR = '''
import os, socket


class PythonPredictor:
    def __init__(self, config):
        self.config = config

    def predict(self, payload):
        return {"host": socket.gethostname(), "replica": os.environ.get("SLUICE_REPLICA_ID"), "echo": payload}
'''


# -- the deployment ---------------------------------------------------------------------------------
@dataclass
class TwoHosts:
    a: Host
    b: Host
    on_a: LookFrom
    client: Client
    redis_url: str
    bucket: str
    env_of: Callable[[Host], dict[str, str]]
    work: Path

    def node(self, host: Host) -> str:
        return f"node@{host.label}"

    def start_replica(self, host: Host, api: str, bind: str) -> None:
        """`sluice serve` on `host`, listening on `bind`, with no `--advertise`: the launcher finds
        the address the proxy reaches it at by itself."""
        host.spawn(f"replica-{api}", [
            sys.executable, "-m", "sluice.cli", "serve", api, "--port", str(REPLICA_PORT), "--host", bind,
            "--api-url", f"http://{ADDRESS_A}:{PROXY_PORT}",
        ], self.env_of(host), self.work)

    def logs(self) -> str:
        return self.a.logs() + "\n" + self.b.logs()


def _child_env(host: Host, *, redis_url: str, bucket: str, api_keys: str, work: Path) -> dict[str, str]:
    """What a process on `host` is configured with: everything at A's address, nothing on loopback."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "AWS_")) and k not in ("STORAGE_EMULATOR_HOST", "PYTHONPATH")}
    env.update(LOOPS)
    env.update({
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_STORAGE": f"s3://{bucket}/bundles",
        "SLUICE_CACHE_DIR": str(work / host.label / "cache"),
        "SLUICE_API_KEYS": api_keys,
        "SLUICE_URL": f"http://{ADDRESS_A}:{PROXY_PORT}",
        "SLUICE_API_URL": f"http://{ADDRESS_A}:{PROXY_PORT}",
        "AWS_ENDPOINT_URL": f"http://{ADDRESS_A}:{S3_PORT}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    return env


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    for program in ("redis-server", "haproxy"):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is not installed: `make test` installs it with apt")
    work = tmp_path_factory.mktemp("two-hosts")
    a, b = make_hosts(work)
    on_a: LookFrom | None = None
    deployment: TwoHosts | None = None
    try:
        on_a = LookFrom(a)
        password, api_key = secrets.token_hex(16), secrets.token_hex(16)
        redis_url = f"redis://:{password}@{ADDRESS_A}:{REDIS_PORT}/0"
        bucket = f"sluice-{uuid.uuid4().hex[:12]}"

        def env_of(host: Host) -> dict[str, str]:
            return _child_env(host, redis_url=redis_url, bucket=bucket, api_keys=api_key, work=work)

        env_a, env_b = env_of(a), env_of(b)
        (work / "redis").mkdir()
        a.spawn("redis", ["redis-server", "--bind", ADDRESS_A, "--port", str(REDIS_PORT), "--requirepass", password,
                          "--dir", str(work / "redis"), "--save", "", "--appendonly", "no"], env_a, work)
        a.spawn("s3", [sys.executable, "-m", "moto.server", "-H", ADDRESS_A, "-p", str(S3_PORT)], env_a, work)
        redis_client = redis.Redis.from_url(redis_url)
        on_a(wait_for, redis_client.ping, STARTUP_S, "redis-server on host A")
        on_a(wait_for, lambda: requests.get(f"http://{ADDRESS_A}:{S3_PORT}/", timeout=2), STARTUP_S,
             "the S3 server on host A")

        def create_bucket() -> None:
            import boto3

            boto3.client("s3", endpoint_url=env_a["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                         aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket=bucket)

        on_a(create_bucket)

        worker = [sys.executable, "-m", "celery", "-A", "jobs", "worker", "-Q", "cpu", "-n", "node@%h",
                  "--loglevel", "INFO", "--without-gossip", "--without-mingle"]
        a.spawn("api", [sys.executable, "-m", "gunicorn", "-b", f"{ADDRESS_A}:{API_PORT}", "-w", "1",
                        "--timeout", "120", "api:create_app()"], env_a, work)
        a.spawn("proxy", [sys.executable, "-m", "sluice.cli", "proxy", "--port", str(PROXY_PORT), "--bind", ADDRESS_A,
                          "--management", f"{ADDRESS_A}:{API_PORT}"], env_a, work)
        a.spawn("beat", [sys.executable, "-m", "celery", "-A", "jobs", "beat", "--loglevel", "INFO",
                         "-s", str(work / "beat-schedule")], env_a, work)
        a.spawn("worker", worker, env_a, work)
        b.spawn("worker", worker, env_b, work)

        deployment = TwoHosts(a, b, on_a, Client(f"http://{ADDRESS_A}:{PROXY_PORT}", api_key=api_key),
                              redis_url, bucket, env_of, work)
        public = f"http://{ADDRESS_A}:{PROXY_PORT}/healthz"
        on_a(wait_for, lambda: requests.get(public, timeout=2).ok, STARTUP_S, "the API through the proxy")
        for host in (a, b):
            on_a(wait_for, lambda host=host: redis_client.hexists("sluice:nodes", deployment.node(host)), STARTUP_S,
                 f"the worker node of {host.label} to announce itself")
        yield deployment
    except BaseException:
        print(a.logs() + "\n" + b.logs())
        raise
    finally:
        if deployment is not None:
            print(deployment.logs())
        if on_a is not None:
            on_a.close()
        remove_hosts(a, b)


# -- projects ---------------------------------------------------------------------------------------
def write_project(folder: Path, name: str, kind: str, source: str, config: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(source)
    api = {"name": name, "kind": kind,
           "predictor": {"type": "python", "path": "predictor.py", "config": config or {}}, "compute": {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def answering_hosts(deployment: TwoHosts, api: str, requests_count: int) -> Counter[str]:
    """Which hosts answered `requests_count` realtime requests sent through the proxy."""
    seen: Counter[str] = Counter()
    for n in range(requests_count):
        answer = deployment.on_a(deployment.client.predict, api, {"n": n})
        assert answer["echo"] == {"n": n}
        seen[answer["host"]] += 1
    return seen


# -- the story --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def realtime_api(two_hosts: TwoHosts, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A realtime API with one replica on each host, both routed by the proxy on host A."""
    api = f"rt-{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("realtime-project")
    two_hosts.on_a(two_hosts.client.deploy, write_project(folder, api, "RealtimeAPI", REALTIME_PREDICTOR))
    # Host A's replica binds A's address; host B's binds every address and, as host B's name does
    # not resolve (nor would a Debian host's, to anything but 127.0.1.1), must work out that the
    # proxy reaches it at 10.77.0.2, the address it reaches Redis from.
    two_hosts.start_replica(two_hosts.a, api, bind=ADDRESS_A)
    two_hosts.start_replica(two_hosts.b, api, bind="0.0.0.0")

    def both_routed() -> bool:
        replicas = two_hosts.on_a(two_hosts.client.get_api, api)["replicas"]
        return {r["address"] for r in replicas if r["ready"]} == {
            f"{ADDRESS_A}:{REPLICA_PORT}", f"{ADDRESS_B}:{REPLICA_PORT}"}

    wait_for(both_routed, STARTUP_S, "a ready replica on each host, announced at the host's own address")
    return api


def test_the_realtime_api_answers_through_the_proxy_from_the_replicas_of_both_hosts(
    two_hosts: TwoHosts, realtime_api: str
) -> None:
    seen: Counter[str] = Counter()

    def answered_by_both() -> bool:
        seen.update(answering_hosts(two_hosts, realtime_api, 10))
        return {"host-a", "host-b"} <= set(seen)

    wait_for(answered_by_both, STARTUP_S, "answers from both hosts through the proxy")
    assert set(seen) == {"host-a", "host-b"}, seen


def test_a_job_runs_on_both_hosts_and_finishes_on_host_a_when_host_b_dies(
    two_hosts: TwoHosts, realtime_api: str, tmp_path: Path
) -> None:
    client, on_a = two_hosts.client, two_hosts.on_a
    api = f"batch-{uuid.uuid4().hex[:8]}"
    lines, completions = tmp_path / "lines.jsonl", tmp_path / "completions.jsonl"
    on_a(client.deploy, write_project(tmp_path / api, api, "BatchAPI", BATCH_PREDICTOR))
    output = f"s3://{two_hosts.bucket}/out"
    job_id = on_a(client.submit_job, api, {
        "workers": 2,
        "item_list": {"items": ITEMS, "batch_size": BATCH_SIZE},
        "config": {"sleep": BATCH_SLEEP_S, "lines": str(lines), "completions": str(completions)},
        "output": {"path": output, "format": "jsonl"},
    })["job_id"]

    # Both hosts' nodes take the job, and both run some of its batches.
    store = JobStore(redis.Redis.from_url(two_hosts.redis_url))
    nodes = on_a(wait_for, lambda: len(store.state(job_id, api).nodes) == 2 and store.state(job_id, api).nodes,
                 JOB_DEADLINE_S, "the job placed on two nodes")
    assert set(nodes) == {two_hosts.node(two_hosts.a), two_hosts.node(two_hosts.b)}

    def batches_by_host() -> Counter[str]:
        return Counter(line["host"] for line in read_lines(lines))

    wait_for(lambda: batches_by_host()["host-b"] >= 3 * BATCH_SIZE and batches_by_host()["host-a"] >= BATCH_SIZE,
             JOB_DEADLINE_S, "batches run on both hosts")
    status = on_a(client.job, api, job_id)
    assert status["status"] == "status_running", "host B must die while the job still has batches to run"

    # A power cut on host B: its worker node, its replica launcher and the replica's gunicorn.
    two_hosts.b.kill_everything()
    runs_before_kill = read_lines(lines)

    final = on_a(wait_for, lambda: (s := client.job(api, job_id))["status"] in TERMINAL_STATUSES and s,
                 JOB_DEADLINE_S, "the job to end after host B died")
    assert final["status"] == "status_succeeded", final
    total_batches = -(-len(ITEMS) // BATCH_SIZE)
    assert (final["batch_metrics"]["succeeded"], final["batch_metrics"]["failed"]) == (total_batches, 0)

    # The output holds every item exactly once, from both hosts.
    def read_output() -> list[dict[str, Any]]:
        import boto3

        s3 = boto3.client("s3", endpoint_url=f"http://{ADDRESS_A}:{S3_PORT}", aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        prefix = f"out/{job_id}/"
        listed = s3.list_objects_v2(Bucket=two_hosts.bucket, Prefix=prefix)["Contents"]
        rows = []
        for entry in listed:
            if entry["Key"].rsplit("/", 1)[-1].startswith("part-"):
                body = s3.get_object(Bucket=two_hosts.bucket, Key=entry["Key"])["Body"].read().decode()
                rows.extend(json.loads(line) for line in body.splitlines() if line.strip())
        return rows

    rows = on_a(read_output)
    assert Counter(row["item"] for row in rows) == Counter(ITEMS), "every item in the output exactly once"
    assert {row["host"] for row in rows} == {"host-a", "host-b"}

    # Every item ran; a batch ran twice only when its first run was on host B, cut off by the kill.
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in read_lines(lines):
        runs[line["item"]].append(line)
    assert sorted(runs) == ITEMS
    for item, item_runs in runs.items():
        assert all(run["host"] == "host-b" for run in item_runs[:-1]), (item, item_runs)
    after_kill = read_lines(lines)[len(runs_before_kill):]
    assert after_kill and {line["host"] for line in after_kill} == {"host-a"}, "host A carried on alone"

    done = read_lines(completions)
    assert done == [{"host": "host-a", "job_id": job_id}], "on_job_complete ran once, on host A"

    # The proxy stops routing to host B's dead replica: the realtime API answers from host A alone.
    def only_host_a_answers() -> bool:
        return set(answering_hosts(two_hosts, realtime_api, 6)) == {"host-a"}

    wait_for(only_host_a_answers, JOB_DEADLINE_S, "the realtime API answering from host A only")
