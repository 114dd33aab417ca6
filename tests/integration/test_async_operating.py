"""Operating an AsyncAPI: its request counts in Redis, `/metrics`, `sluice get` and `sluice logs`
for one request, against the session's stack (two worker nodes, real Redis)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from click.testing import CliRunner

from foundation.figure_store import RedisFigureStore
from foundation.figures import ASYNC_REQUESTS, ASYNC_SECONDS, read_figures
from jobs.asyncapi.store import RedisAsyncRequests
from sluice.cli import main
from sluice.client import ClientError
from testbed.waiting import wait_for
from tests.contracts.async_counts import API, AsyncCountsContract, move_four_requests
from tests.integration.test_metrics import scrape, value

# Logs a line per request; one carrying `hold` runs until that file exists (a request seen in progress).
PREDICTOR = '''
import logging, os, time

log = logging.getLogger("gauge-predictor")


class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload, request_id):
        log.warning("predicting %s for %s", payload.get("say"), request_id)
        if "hold" in payload:
            deadline = time.monotonic() + 60
            while not os.path.exists(payload["hold"]) and time.monotonic() < deadline:
                time.sleep(0.02)
        if "raise" in payload:
            raise ValueError("refused " + payload["raise"])
        return {"said": payload.get("say")}
'''


class TestRedisRequestCounts(AsyncCountsContract):
    @pytest.fixture
    def requests(self, redis_client: redis.Redis) -> RedisAsyncRequests:
        return RedisAsyncRequests(redis_client, retention_s=600)


def test_the_one_call_that_ends_a_request_counts_its_outcome_and_duration(redis_client: redis.Redis):
    move_four_requests(RedisAsyncRequests(redis_client, retention_s=600))
    totals = read_figures(RedisFigureStore(redis_client), [ASYNC_REQUESTS, ASYNC_SECONDS])
    assert totals[ASYNC_REQUESTS.name] == {(API, "completed"): 1, (API, "failed"): 2}
    seconds = totals[ASYNC_SECONDS.name][(API,)]
    assert seconds.count == 3 and seconds.sum == pytest.approx(3.0 + 0.5 + 4.0)
    buckets = dict(seconds.buckets)  # cumulative: 0.5 s, then 3 s and 4 s (both up to 5 s)
    assert (buckets["0.25"], buckets["0.5"], buckets["2.5"], buckets["5.0"]) == (0, 1, 1, 3)


def _deploy(client: Any, folder: Path, name: str, min_replicas: int = 1, **autoscaling: Any) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(PREDICTOR)
    api = {"name": name, "kind": "AsyncAPI", "predictor": {"type": "python", "path": "predictor.py"},
           "compute": {"cpu": 1}, "autoscaling": {"min_replicas": min_replicas, **autoscaling}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    return name


def _cli(stack: Any, *args: str) -> str:
    result = CliRunner().invoke(main, ["--url", stack.url, *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_an_async_apis_counts_nodes_metrics_and_request_logs_are_shown(stack, client, tmp_path):
    name = _deploy(client, tmp_path / "project", f"gauge-{uuid.uuid4().hex[:8]}", min_replicas=2)
    release = tmp_path / "release"
    held = client.submit_async(name, {"say": "held", "hold": str(release)})

    def running() -> dict[str, Any] | None:
        answer = client.api(name)
        return answer if answer["requests"]["in_progress"] == 1 else None

    shown = wait_for(running, 120, "the held request in progress")
    assert shown["requests"]["in_queue"] == 0
    assert len(shown["nodes"]) == 2  # min_replicas: the stack's two worker nodes (both on queue cpu) serve it
    assert value(scrape(stack.url), "sluice_async_requests_in_progress", api=name) == 1
    table = _cli(stack, "get", name)
    assert "1 in progress" in table and all(node in table for node in shown["nodes"])

    release.write_text("go")
    assert client.wait_async(name, held, timeout=60)["status"] == "completed"
    failed = client.submit_async(name, {"say": "no", "raise": "this"})
    assert client.wait_async(name, failed, timeout=60)["status"] == "failed"

    samples = scrape(stack.url)
    assert value(samples, "sluice_async_requests_total", api=name, status="completed") == 1
    assert value(samples, "sluice_async_requests_total", api=name, status="failed") == 1
    assert value(samples, "sluice_async_request_duration_seconds_count", api=name) == 2
    assert value(samples, "sluice_async_requests_in_progress", api=name) == 0
    assert value(samples, "sluice_async_requests_in_queue", api=name) == 0
    as_json = json.loads(_cli(stack, "get", name, "-o", "json"))
    assert as_json["requests"]["in_progress"] == 0 and as_json["nodes"] == shown["nodes"]

    # The predictor's lines while it ran the request are the request's, and only that request's.
    def logged() -> list[dict[str, Any]]:
        return client.get_async_logs(name, failed)["lines"]

    lines = wait_for(logged, 30, "the failed request's lines in its log stream")
    messages = " ".join(line["message"] for line in lines)
    assert f"predicting no for {failed}" in messages and "refused this" in messages
    assert held not in messages
    printed = _cli(stack, "logs", name, held)
    assert f"predicting held for {held}" in printed and failed not in printed
    with pytest.raises(ClientError) as unknown:
        client.get_async_logs(name, "no-such-request")
    assert unknown.value.kind == "request_not_found"
    # The API's whole log: every request's lines, from every node (`sluice logs API`).
    whole = " ".join(line["message"] for line in client.get_logs(name)["lines"])
    assert f"predicting held for {held}" in whole and f"predicting no for {failed}" in whole
    printed = _cli(stack, "logs", name)
    assert f"predicting held for {held}" in printed and f"predicting no for {failed}" in printed


@pytest.mark.slow
def test_an_async_api_scales_from_zero_to_two_nodes_on_its_queue_and_back_to_zero(stack, client, tmp_path):
    """Windows of 10 s and no stabilisation wait; the stack's beat steps every second, on two nodes."""
    name = _deploy(client, tmp_path / "project", f"scale-{uuid.uuid4().hex[:8]}", min_replicas=0, max_replicas=2,
                   target_replica_concurrency=1, window="10s", downscale_stabilization_period="0s",
                   upscale_stabilization_period="0s")
    assert client.api(name)["nodes"] == []  # nothing queued: no node holds its predictor
    release = tmp_path / "release"
    held = [client.submit_async(name, {"say": str(i), "hold": str(release)}) for i in range(4)]

    def scaled(count: int) -> Any:
        answer = client.api(name)
        return answer if len(answer["nodes"]) == count and answer["scaling"]["desired"] == count else None

    two = wait_for(lambda: scaled(2), 60, "two nodes serving the queued requests")
    assert two["scaling"]["pending"] == 0 and two["scaling"]["in_flight"] >= 1
    metrics = scrape(stack.url)
    assert value(metrics, "sluice_replicas_desired", api=name) == 2
    assert value(metrics, "sluice_replicas", api=name, state="ready") == 2
    release.write_text("go")
    assert [client.wait_async(name, r, timeout=60)["status"] for r in held] == ["completed"] * 4
    wait_for(lambda: scaled(0), 60, "no node once the queue stayed empty for a window")
    late = client.submit_async(name, {"say": "late"})  # from zero: one node comes for it
    assert client.wait_async(name, late, timeout=60)["result"] == {"said": "late"}
