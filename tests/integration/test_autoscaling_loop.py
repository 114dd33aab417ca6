"""The realtime autoscaling loop end to end: load rises, Sluice adds replicas on two hosts; load
falls, it removes them again, and no client sees a failed request on the way.

Every piece is the real one, as `sluice up` and `sluice replicas` run them: haproxy (`sluice
proxy`) samples each API's requests in flight and publishes them, beat's `scale-realtime-apis`
step turns them into a replica count with Cortex's algorithm (window 10 s, stabilisation shortened
so the test never waits for the defaults), its `place-realtime-replicas` step places that count on
the hosts' room, each host's replica manager starts the launchers assigned to it (a replica is
routed once ready) and retires the extras by draining them (out of the proxy first, then stopped).

Two hosts on one machine: the embedded stack offers room for two replicas of 200m, a second
`sluice replicas` process (host-b, on loopback, sharing the stack's bundle storage) room for one,
so three replicas need both. They share the loopback interface, not a network namespace each.

This is the fallback of test_autoscaling_two_hosts.py, which runs the same story (and more: a host
killed) on two hosts in network namespaces: where this machine may make namespaces, that test runs
and this one skips, so the loop runs once; where namespaces are refused (no root), this one runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from foundation.hosts import Resources
from foundation.replica_placement import RedisReplicaAssignments
from foundation.replica_scale import RedisScaleBook
from sluice.client import Client
from sluice.embedded import Stack, free_port
from testbed.waiting import wait_for

from .conftest import FAST_LOOPS, closing_client
from .netns_hosts import namespaces_refused
from .steady_load import SteadyLoad, describe

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOST_B = "host-b"
READY_TIMEOUT_S = 120
# Scaling 1 -> 2 -> 3 takes two scaler ticks (10 s each; Cortex's max_upscale_factor 1.5 allows
# one more replica at a time from 1 and 2), back 3 -> 1 one tick once the window has emptied
# (max_downscale_factor 0.3 allows it); each bound is generous, since a loaded machine starts
# gunicorn slowly, and holds nothing a fast machine must reach.
SCALE_TIMEOUT_S = 120

# Every request takes a little time, so that concurrent clients are requests in flight.
SLOW_PREDICTOR = '''
import os, time


class PythonPredictor:
    def __init__(self, config):
        self.seconds = config["seconds"]

    def predict(self, payload):
        time.sleep(self.seconds)
        return {"n": payload["n"], "replica": os.environ.get("SLUICE_REPLICA_ID")}
'''

AUTOSCALING = {
    "min_replicas": 1, "max_replicas": 3, "target_replica_concurrency": 1, "window": "10s",
    "upscale_stabilization_period": "0s", "downscale_stabilization_period": "10s", "max_downscale_factor": 0.3,
}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The embedded stack (proxy, API, beat, a replica host with room for two replicas, no worker
    node) and host-b, a `sluice replicas` process with room for one."""
    if not namespaces_refused():
        pytest.skip("network namespaces are permitted here: test_autoscaling_two_hosts.py runs this loop on two "
                    "hosts in namespaces")
    data_dir = tmp_path_factory.mktemp("autoscaling")
    env = {**FAST_LOOPS, "SLUICE_STORAGE": str(data_dir / "storage")}
    with Stack(port=free_port(), workers=0, data_dir=data_dir, env=env,
               offers=Resources(cpu_m=400, mem=4 * 2**30, gpu=0)) as stack:
        log_path = data_dir / "logs" / f"{HOST_B}.log"
        host_env = {**os.environ, **env, "SLUICE_REDIS_URL": stack.redis_url or "",
                    "SLUICE_CACHE_DIR": str(data_dir / HOST_B),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]),
                                                               os.environ.get("PYTHONPATH")]))}
        with open(log_path, "ab") as log:
            host_b = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "replicas", "--host-id", HOST_B, "--cpu", "200m",
                 "--mem", "1Gi", "--gpu", "0", "--api-url", stack.url],
                env=host_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=data_dir)
        try:
            yield stack
        finally:
            host_b.send_signal(signal.SIGTERM)  # drains and stops its replicas
            try:
                host_b.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(host_b.pid, signal.SIGKILL)
                host_b.wait()
            print(stack.logs())
            print(f"----- {HOST_B} -----\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-40:]))


def deploy_slow_api(client: Client, folder: Path) -> str:
    name = f"scaled-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    (folder / "predictor.py").write_text(SLOW_PREDICTOR)
    api = {"name": name, "kind": "RealtimeAPI", "compute": {"cpu": "200m"}, "autoscaling": AUTOSCALING,
           "predictor": {"type": "python", "path": "predictor.py", "config": {"seconds": 0.05}}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    client.wait_ready(name, timeout=READY_TIMEOUT_S)
    return name


def test_a_realtime_api_scales_to_three_replicas_on_two_hosts_under_load_and_back_to_one_without_a_failed_request(
    two_hosts, tmp_path,
):
    client = closing_client(two_hosts.url, timeout=30)
    r = redis.Redis.from_url(two_hosts.redis_url or "")
    book, assignments = RedisScaleBook(r), RedisReplicaAssignments(r)
    name = deploy_slow_api(client, tmp_path / "project")
    url = f"{two_hosts.url}/{name}"

    def serving() -> set[str]:
        return {x["id"] for x in client.api(name)["replicas"] if x["ready"] and not x["draining"]}

    assert len(serving()) == 1  # init_replicas: min_replicas

    # One client all along, so requests flow while replicas come and, above all, while they go.
    with SteadyLoad(url, clients=1) as steady:
        steady.wait_for_answers(10, 60, "answers to the steady client")
        # Four more: about five requests in flight against a target of one per replica.
        with SteadyLoad(url, clients=4) as burst:
            wait_for(lambda: len(serving()) == 3, SCALE_TIMEOUT_S, "three ready replicas")
            scaled_up = book.get(name)
            placed_up = assignments.all()[name]
            three = serving()
            # Each new replica is routed, not only ready: both loads reach all three.
            wait_for(lambda: three <= {a.body["replica"] for a in steady.answers + burst.answers if a.ok}, 60,
                     "answers from each of the three replicas")
        # Back to one client, about one request in flight: the scaler goes down to one replica,
        # which happens while that client's requests keep coming.
        wait_for(lambda: len(client.api(name)["replicas"]) == 1, SCALE_TIMEOUT_S,
                 "two replicas drained and gone")
        scaled_down = book.get(name)
        (last,) = serving()
        mark = len(steady.answers)
        steady.wait_for_answers(10, 60, "answers from the one replica left")

    answers = steady.answers + burst.answers
    failures = [a for a in answers if not a.ok]
    print(f"\nautoscaling 1 -> 3 -> 1 on two hosts: {len(answers)} requests, {len(failures)} not 2xx; "
          f"scaled up on {scaled_up}, placed {placed_up.hosts}; down on {scaled_down}")
    assert failures == [], describe(failures)
    # The scaler's figure is what placement placed: three replicas on the two hosts, host-b's one.
    assert scaled_up is not None and scaled_up.desired == 3 and scaled_up.in_flight > 1
    assert placed_up.desired == 3 and placed_up.hosts.get(HOST_B) == 1 and placed_up.placed == 3
    assert scaled_down is not None and scaled_down.desired == 1 and assignments.all()[name].placed == 1
    assert {a.body["replica"] for a in steady.answers[mark:]} == {last}
