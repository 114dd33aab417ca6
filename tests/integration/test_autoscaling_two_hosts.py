"""The realtime autoscaling loop across two hosts, each a network namespace of its own
(tests/integration/netns_hosts.py): load rises, Sluice adds replicas on both hosts; load falls, it
removes them again, and no client sees a failed request on the way. Then a host dies, and its
replica comes back on the other one.

Host A (10.77.0.1) runs what `sluice up` runs: redis-server, the management API, the proxy, beat,
and `sluice replicas` offering room for two replicas of 200m. Host B (10.77.0.2) runs only
`sluice replicas --host-id host-b --cpu 200m`, bound to every address and advertising its own,
reaching Redis and the proxy at A's address. Both share the file system, so the bundle storage is
one folder. Each predictor answers with `socket.gethostname()`, which each host's UTS namespace
makes `host-a` or `host-b`: an answer names the host whose replica served it.

Every piece is the real one: haproxy samples each API's requests in flight, beat's
`scale-realtime-apis` turns them into a count (window 10 s, stabilisation shortened),
`place-realtime-replicas` places it on the hosts' room, and each host's replica manager starts the
launchers assigned to it and drains the ones no longer assigned. The host TTL is shortened to 4 s
(`SLUICE_HOST_TTL`) so that a dead host is noticed within seconds, in real time.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) for `ip netns add`; skipped with the reason
where that is refused (test_autoscaling_loop.py then runs the loop on one loopback instead).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
import yaml

from foundation.hosts import RedisHostDirectory
from foundation.replica_placement import RedisReplicaAssignments
from foundation.replica_scale import RedisScaleBook
from sluice.client import Client

from .conftest import FAST_LOOPS, closing_client
from .netns_hosts import (
    ADDRESS_A,
    ADDRESS_B,
    Host,
    LookFrom,
    enter_network_namespace,
    make_hosts,
    remove_hosts,
    wait_for,
)
from .steady_load import SteadyLoad, describe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REDIS_PORT, API_PORT, PROXY_PORT = 6379, 8000, 8888
STARTUP_S = 90.0
READY_TIMEOUT_S = 120.0
# Scaling 1 -> 2 -> 3 takes two scaler ticks (10 s each; Cortex's max_upscale_factor 1.5 allows
# one more replica at a time from 1 and 2), back 3 -> 1 one tick once the window has emptied;
# each bound is generous, since a loaded machine starts gunicorn slowly.
SCALE_TIMEOUT_S = 120.0
HOST_TTL_S = 4  # SLUICE_HOST_TTL here: host B's death is noticed within seconds, not 15
REPLICA_CPU = "200m"

# Every request takes a little time, so that concurrent clients are requests in flight; the answer
# names the host and the replica that served it.
SLOW_PREDICTOR = '''
import os, socket, time


class PythonPredictor:
    def __init__(self, config):
        self.seconds = config["seconds"]

    def predict(self, payload):
        time.sleep(self.seconds)
        return {"n": payload["n"], "host": socket.gethostname(), "replica": os.environ.get("SLUICE_REPLICA_ID")}
'''

SCALING = {
    "min_replicas": 1, "max_replicas": 3, "target_replica_concurrency": 1, "window": "10s",
    "upscale_stabilization_period": "0s", "downscale_stabilization_period": "10s", "max_downscale_factor": 0.3,
}
TWO_ALWAYS = {"min_replicas": 2, "max_replicas": 2}


@dataclass
class TwoHosts:
    """Host A's stack and host B's replica agent, and the test's seat on host A."""

    a: Host
    b: Host
    on_a: LookFrom
    client: Client
    redis: redis.Redis  # reached from host A only: call it through `on_a`

    @property
    def url(self) -> str:
        return f"http://{ADDRESS_A}:{PROXY_PORT}"

    def load(self, api: str, clients: int) -> SteadyLoad:
        """Clients on host A posting to `api` through A's proxy."""
        namespace = self.a.namespace
        return SteadyLoad(f"{self.url}/{api}", clients, on_thread=lambda: enter_network_namespace(namespace))

    def serving(self, api: str) -> list[dict[str, Any]]:
        """The API's replicas that are ready and not draining, as `GET /apis/<name>` lists them."""
        return [r for r in self.on_a(self.client.api, api)["replicas"] if r["ready"] and not r["draining"]]

    def placed(self, api: str) -> dict[str, int]:
        """Placement's word: how many of the API's replicas each host runs."""
        return self.on_a(lambda: RedisReplicaAssignments(self.redis).all()[api].hosts)

    def logs(self) -> str:
        return self.a.logs(60) + "\n" + self.b.logs(60)


def _env(host: Host, *, redis_url: str, api_key: str, work: Path) -> dict[str, str]:
    """What a process on `host` is configured with: Redis and the proxy at A's address, nothing on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_") and k != "PYTHONPATH"}
    env.update(FAST_LOOPS)
    env.update({
        "SLUICE_HOST_TTL": str(HOST_TTL_S),
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_STORAGE": str(work / "storage"),
        "SLUICE_CACHE_DIR": str(work / host.label / "cache"),
        "SLUICE_API_KEYS": api_key,
        "SLUICE_URL": f"http://{ADDRESS_A}:{PROXY_PORT}",
        "SLUICE_API_URL": f"http://{ADDRESS_A}:{PROXY_PORT}",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    })
    return env


def replica_agent(host: Host, cpu: str, bind: str) -> list[str]:
    """`sluice replicas` on `host`, offering `cpu` and advertising the host's own address."""
    return [sys.executable, "-m", "sluice.cli", "replicas", "--host-id", host.label, "--cpu", cpu, "--mem", "4Gi",
            "--gpu", "0", "--host", bind, "--advertise", host.address,
            "--api-url", f"http://{ADDRESS_A}:{PROXY_PORT}"]


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    for program in ("redis-server", "haproxy"):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is not installed: `make test` installs it with apt")
    work = tmp_path_factory.mktemp("autoscaling-two-hosts")
    a, b = make_hosts(work)
    on_a: LookFrom | None = None
    deployment: TwoHosts | None = None
    try:
        on_a = LookFrom(a)
        password, api_key = secrets.token_hex(16), secrets.token_hex(16)
        redis_url = f"redis://:{password}@{ADDRESS_A}:{REDIS_PORT}/0"
        env_a, env_b = (_env(host, redis_url=redis_url, api_key=api_key, work=work) for host in (a, b))
        (work / "redis").mkdir()
        a.spawn("redis", ["redis-server", "--bind", ADDRESS_A, "--port", str(REDIS_PORT), "--requirepass", password,
                          "--dir", str(work / "redis"), "--save", "", "--appendonly", "no"], env_a, work)
        client = redis.Redis.from_url(redis_url)
        on_a(wait_for, client.ping, STARTUP_S, "redis-server on host A")
        a.spawn("api", [sys.executable, "-m", "gunicorn", "-b", f"{ADDRESS_A}:{API_PORT}", "-w", "1",
                        "--timeout", "120", "api:create_app()"], env_a, work)
        a.spawn("proxy", [sys.executable, "-m", "sluice.cli", "proxy", "--port", str(PROXY_PORT), "--bind", ADDRESS_A,
                          "--management", f"{ADDRESS_A}:{API_PORT}"], env_a, work)
        a.spawn("beat", [sys.executable, "-m", "celery", "-A", "jobs", "beat", "--loglevel", "INFO",
                         "-s", str(work / "beat-schedule")], env_a, work)
        a.spawn("replicas", replica_agent(a, "400m", ADDRESS_A), env_a, work)  # room for two
        b.spawn("replicas", replica_agent(b, REPLICA_CPU, "0.0.0.0"), env_b, work)  # room for one

        deployment = TwoHosts(a, b, on_a, closing_client(f"http://{ADDRESS_A}:{PROXY_PORT}", api_key=api_key,
                                                         timeout=30), client)
        on_a(wait_for, lambda: requests.get(f"{deployment.url}/healthz", timeout=2).ok, STARTUP_S,
             "the API through the proxy")
        directory = RedisHostDirectory(client)
        on_a(wait_for, lambda: {h.host_id for h in directory.all()} == {"host-a", "host-b"}, STARTUP_S,
             "both hosts to offer their room")
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


@pytest.fixture
def deploy(two_hosts: TwoHosts, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], str]]:
    """Deploy the slow predictor under a fresh name with the given autoscaling; deleted afterwards,
    so the next test finds the hosts' room free."""
    deployed: list[str] = []

    def deploy_api(autoscaling: dict[str, Any]) -> str:
        name = f"scaled-{uuid.uuid4().hex[:8]}"
        folder = tmp_path / name
        folder.mkdir()
        (folder / "predictor.py").write_text(SLOW_PREDICTOR)
        api = {"name": name, "kind": "RealtimeAPI", "compute": {"cpu": REPLICA_CPU}, "autoscaling": autoscaling,
               "predictor": {"type": "python", "path": "predictor.py", "config": {"seconds": 0.05}}}
        (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
        two_hosts.on_a(two_hosts.client.deploy, folder / "cortex.yaml")
        deployed.append(name)
        two_hosts.on_a(two_hosts.client.wait_ready, name, timeout=READY_TIMEOUT_S)
        return name

    yield deploy_api
    for name in deployed:
        with contextlib.suppress(Exception):
            two_hosts.on_a(two_hosts.client.delete_api, name)


def test_a_realtime_api_scales_to_three_replicas_on_two_hosts_under_load_and_back_to_one_without_a_failed_request(
    two_hosts: TwoHosts, deploy: Callable[[dict[str, Any]], str],
) -> None:
    on_a = two_hosts.on_a
    book = RedisScaleBook(two_hosts.redis)
    name = deploy(SCALING)

    def serving() -> set[str]:
        return {r["id"] for r in two_hosts.serving(name)}

    assert len(serving()) == 1  # init_replicas: min_replicas

    # One client all along, so requests flow while replicas come and, above all, while they go.
    with two_hosts.load(name, clients=1) as steady:
        steady.wait_for_answers(10, 60, "answers to the steady client")
        # Four more: about five requests in flight against a target of one per replica.
        with two_hosts.load(name, clients=4) as burst:
            wait_for(lambda: len(serving()) == 3, SCALE_TIMEOUT_S, "three ready replicas")
            scaled_up = on_a(book.get, name)
            placed_up = two_hosts.placed(name)
            addresses_up = {r["address"].rsplit(":", 1)[0] for r in two_hosts.serving(name)}
            three = serving()
            # Each new replica is routed, not only ready: the loads reach all three, host B's too.
            wait_for(lambda: three <= {a.body["replica"] for a in steady.answers + burst.answers if a.ok}, 60,
                     "answers from each of the three replicas")
        # Back to one client, about one request in flight: the scaler goes down to one replica,
        # which happens while that client's requests keep coming.
        wait_for(lambda: len(on_a(two_hosts.client.api, name)["replicas"]) == 1, SCALE_TIMEOUT_S,
                 "two replicas drained and gone")
        scaled_down = on_a(book.get, name)
        placed_down = two_hosts.placed(name)
        (last,) = serving()
        mark = len(steady.answers)
        steady.wait_for_answers(10, 60, "answers from the one replica left")

    answers = steady.answers + burst.answers
    failures = [a for a in answers if not a.ok]
    hosts_answering = {a.body["host"] for a in answers if a.ok}
    print(f"\nautoscaling 1 -> 3 -> 1 on two network namespaces: {len(answers)} requests, {len(failures)} not 2xx; "
          f"scaled up on {scaled_up}, placed {placed_up}; down on {scaled_down}, placed {placed_down}")
    assert failures == [], describe(failures)
    # The scaler's figure is what placement placed: two replicas on host A's room, one on host B's,
    # each reached at its own host's address, and host B's replica really answered.
    assert scaled_up is not None and scaled_up.desired == 3 and scaled_up.in_flight > 1
    assert placed_up == {"host-a": 2, "host-b": 1}
    assert addresses_up == {ADDRESS_A, ADDRESS_B}
    assert hosts_answering == {"host-a", "host-b"}
    assert scaled_down is not None and scaled_down.desired == 1 and sum(placed_down.values()) == 1
    assert {a.body["replica"] for a in steady.answers[mark:]} == {last}


def test_a_host_killed_loses_its_replica_and_it_comes_back_on_the_other_host(
    two_hosts: TwoHosts, deploy: Callable[[dict[str, Any]], str],
) -> None:
    on_a, client = two_hosts.on_a, two_hosts.client
    name = deploy(TWO_ALWAYS)
    # Spread first: one replica on each host, both answering through A's proxy.
    wait_for(lambda: {r["address"].rsplit(":", 1)[0] for r in two_hosts.serving(name)} == {ADDRESS_A, ADDRESS_B},
             READY_TIMEOUT_S, "a ready replica on each host")
    assert two_hosts.placed(name) == {"host-a": 1, "host-b": 1}
    seen: set[str] = set()
    wait_for(lambda: seen.update({on_a(client.predict, name, {"n": n})["host"] for n in range(6)})
             or seen == {"host-a", "host-b"}, 60, "answers from both hosts")

    # A power cut on host B: its agent, its launcher and the replica's gunicorn, all SIGKILLed.
    two_hosts.b.kill_everything()

    # Once host B has been silent for the host TTL, placement puts its replica on host A, whose
    # agent starts it; the proxy routes to it once ready and no longer to the dead one.
    wait_for(lambda: two_hosts.placed(name) == {"host-a": 2}, READY_TIMEOUT_S, "both replicas placed on host A")
    # Host B never withdrew (SIGKILL leaves its agent no time to): its record is still there, but
    # silent past the TTL, which is what placement went by.
    directory = RedisHostDirectory(two_hosts.redis)
    assert [h.host_id for h in on_a(directory.all)] == ["host-a", "host-b"]
    assert [h.host_id for h in on_a(directory.live, time.time(), HOST_TTL_S)] == ["host-a"]
    wait_for(lambda: [r["address"].rsplit(":", 1)[0] for r in two_hosts.serving(name)] == [ADDRESS_A, ADDRESS_A],
             READY_TIMEOUT_S, "two ready replicas, both on host A")

    def answered_from_host_a_only() -> set[str]:
        return {r["replica"] for r in (on_a(client.predict, name, {"n": n}) for n in range(10))
                if r["host"] == "host-a"}

    replicas_on_a = {r["id"] for r in two_hosts.serving(name)}
    wait_for(lambda: answered_from_host_a_only() == replicas_on_a, 60,
             "ten requests in a row answered, by both replicas on host A")
    answers = [on_a(client.predict, name, {"n": n}) for n in range(10)]
    assert {a["host"] for a in answers} == {"host-a"}
