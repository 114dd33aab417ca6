"""`GET /metrics` read before and after a batch job and a burst of realtime requests: every counter
moves by exactly what was done, whichever of the stack's processes did it (two worker nodes,
two API processes, the proxy, a replica).

Figures reach Redis about a second after they are counted, so each check waits until the
figures stop short of or reach what was done, then asserts the exact numbers.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from foundation.proxy_registry import RedisProxyRegistry
from sluice.client import Client
from sluice.embedded import Stack
from testbed.waiting import wait_for

from .test_realtime import write_realtime_project

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Waits at an init gate (the replica is not ready meanwhile); a `hold` request waits at a second
# gate, leaving a mark when it starts; a `fail` request raises.
GATED_PREDICTOR = '''
import os, time


class PythonPredictor:
    def __init__(self, config):
        self.config = config
        while not os.path.exists(config["init_gate"]):
            time.sleep(0.05)

    def predict(self, payload):
        if payload.get("hold"):
            open(self.config["started"], "w").close()
            while not os.path.exists(self.config["gate"]):
                time.sleep(0.02)
        if payload.get("fail"):
            raise ValueError("cannot handle this payload")
        return {"ok": True}
'''


def post(url: str, **kwargs: Any) -> requests.Response:
    """A request on a connection of its own, closed with the answer: an idle keep-alive connection
    of the test's would hold an old haproxy worker after a reload (up to the proxy's keep-alive
    timeout), and with it the proxy's settling on the new replica."""
    return requests.post(url, headers={"Connection": "close"}, **kwargs)


def scrape(url: str) -> Samples:
    """Every sample of /metrics: (sample name, sorted labels) -> value."""
    response = requests.get(f"{url}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "text/plain; version=1.0.0; charset=utf-8"  # one charset
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def settled(url: str, done: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    """/metrics once `done` holds (the figures of the last second have been sent), or the last read."""
    deadline = time.monotonic() + timeout
    samples = scrape(url)
    while not done(samples) and time.monotonic() < deadline:
        time.sleep(0.2)
        samples = scrape(url)
    return samples



def test_a_batch_job_moves_jobs_batches_and_items_by_exactly_what_it_did(stack: Stack, client: Client,
                                                                         deploy_project, events_file):
    api = deploy_project()
    before = scrape(stack.url)
    assert value(before, "sluice_batches_total", api=api, status="succeeded") == 0
    # Ten batches of three on two worker nodes; the batch holding item 13 fails (one try).
    spec = client.submit(api, list(range(30)), batch_size=3, workers=2, tries=1,
                         config={"events": str(events_file), "poison": 13})
    final = client.wait(api, spec["job_id"], timeout=180)
    assert final["status"] == "status_completed_with_failures"

    # Each process sends its figures on its own clock: the API's count of submissions among them.
    after = settled(stack.url, lambda s: value(s, "sluice_batches_total", api=api, status="succeeded") >= 9
                    and value(s, "sluice_jobs_submitted_total", api=api) >= 1)
    assert value(after, "sluice_jobs_total", api=api, status="completed_with_failures") == 1
    assert value(after, "sluice_jobs_total", api=api, status="succeeded") == 0
    assert value(after, "sluice_batches_total", api=api, status="succeeded") == 9
    assert value(after, "sluice_batches_total", api=api, status="failed") == 1
    assert value(after, "sluice_items_total", api=api) == 30
    assert value(after, "sluice_batch_duration_seconds_count", api=api) == 10
    assert value(after, "sluice_batch_duration_seconds_bucket", api=api, le="+Inf") == 10
    assert value(after, "sluice_jobs_submitted_total", api=api) == 1
    assert value(after, "sluice_queue_depth", queue="cpu") >= 0  # the gauge is there for every queue
    assert {value(after, "sluice_queue_depth", queue=q) for q in ("cpu", "gpu", "inf")} == {0}


def test_realtime_requests_and_refusals_are_counted_by_code_and_reason(stack: Stack, client: Client, tmp_path: Path):
    api = f"rtm-{uuid.uuid4().hex[:8]}"
    init_gate, gate, started = tmp_path / "init-gate", tmp_path / "gate", tmp_path / "started"
    config = {"init_gate": str(init_gate), "gate": str(gate), "started": str(started)}
    client.deploy(write_realtime_project(tmp_path / api, api, config, source=GATED_PREDICTOR,
                                         predictor_extra={"max_concurrency": 1, "max_queue_length": 0}))

    # While its predictor is built, the API refuses: not ready.
    for _ in range(2):
        answer = post(f"{stack.url}/{api}", json={}, timeout=30)
        assert answer.status_code == 503 and answer.json()["kind"] == "not_ready"
    refused = settled(stack.url, lambda s: value(s, "sluice_realtime_rejected_total", api=api, reason="not_ready") >= 2)
    assert value(refused, "sluice_realtime_rejected_total", api=api, reason="not_ready") == 2
    assert value(refused, "sluice_realtime_requests_total", api=api, code="503") == 2
    # Its one replica is placed and starting: wanted, not ready.
    building = settled(stack.url, lambda s: value(s, "sluice_replicas", api=api, state="starting") == 1)
    assert value(building, "sluice_replicas", api=api, state="starting") == 1
    assert value(building, "sluice_replicas_desired", api=api) == 1
    assert ("sluice_replicas", (("api", api), ("state", "ready"))) in building
    assert value(building, "sluice_replicas", api=api, state="ready") == 0

    init_gate.touch()
    # Ready and routed, learnt without a request to the API (each would be counted).
    proxies = redis.Redis.from_url(stack.redis_url or "")

    def routed() -> bool:
        replicas = client.api(api)["replicas"]
        ready = [r["id"] for r in replicas if r["ready"]]
        records = RedisProxyRegistry(proxies).live(time.time())
        return bool(ready) and bool(records) and all(p.settled and ready[0] in p.routes for p in records)

    wait_for(routed, 120, "the replica to be ready and routed")
    before = scrape(stack.url)
    assert (value(before, "sluice_replicas", api=api, state="ready"),
            value(before, "sluice_replicas", api=api, state="starting")) == (1, 0)
    assert ("sluice_in_flight", (("api", api),)) in before  # the scaler's figure, shown from the start

    for _ in range(5):
        assert post(f"{stack.url}/{api}", json={}, timeout=30).status_code == 200
    assert post(f"{stack.url}/{api}", json={"fail": True}, timeout=30).status_code == 500
    held: list[requests.Response] = []
    holder = threading.Thread(target=lambda: held.append(
        post(f"{stack.url}/{api}", json={"hold": True}, timeout=60)))
    holder.start()
    try:
        wait_for(started.exists, 30, "the held request to start")
        overloaded = post(f"{stack.url}/{api}", json={}, timeout=30)
        assert overloaded.status_code == 503 and overloaded.json()["kind"] == "overloaded"
    finally:
        gate.touch()
        holder.join()
    assert held[0].status_code == 200

    def moved(samples: Samples, name: str, **labels: str) -> float:
        return value(samples, name, api=api, **labels) - value(before, name, api=api, **labels)

    after = settled(stack.url, lambda s: moved(s, "sluice_realtime_rejected_total", reason="overloaded") >= 1
                    and moved(s, "sluice_realtime_requests_total", code="200") >= 6)
    assert moved(after, "sluice_realtime_requests_total", code="200") == 6
    assert moved(after, "sluice_realtime_requests_total", code="500") == 1
    assert moved(after, "sluice_realtime_requests_total", code="503") == 1  # answered by the proxy
    assert moved(after, "sluice_realtime_rejected_total", reason="overloaded") == 1
    assert moved(after, "sluice_realtime_rejected_total", reason="not_ready") == 0
    # Timed in the replica: the seven it answered, not the one the proxy refused.
    assert moved(after, "sluice_realtime_request_duration_seconds_count") == 7
