"""An AsyncAPI's counts without Redis: the in-memory store's contract, the nodes that serve it,
what `/metrics` shows of them, and a request run by a node moving them."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from api.metrics import FiguresCollector
from foundation.memory import MemoryFigureStore
from jobs.asyncapi.counts import AsyncCounts, window_slots
from jobs.asyncapi.memory import MemoryAsyncRequests
from tests.contracts.async_counts import AsyncCountsContract
from tests.unit.test_async_runner import Harness


class TestMemoryRequestCounts(AsyncCountsContract):
    @pytest.fixture
    def requests(self) -> MemoryAsyncRequests:
        return MemoryAsyncRequests(retention_s=600)


def test_the_minute_is_the_six_whole_slots_before_the_current_one():
    assert window_slots(1065.0) == [100, 101, 102, 103, 104, 105]
    assert window_slots(1069.9) == window_slots(1060.0)


def test_metrics_show_each_async_apis_queued_and_running_requests():
    registry = CollectorRegistry(auto_describe=False)
    counts = {"slow": AsyncCounts(in_queue=7, in_progress=2), "idle": AsyncCounts()}
    registry.register(FiguresCollector(MemoryFigureStore(), lambda: {"cpu": 0}, lambda: counts))
    samples = {(s.name, tuple(s.labels.items())): s.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples}
    assert samples[("sluice_async_requests_in_queue", (("api", "slow"),))] == 7
    assert samples[("sluice_async_requests_in_progress", (("api", "slow"),))] == 2
    assert samples[("sluice_async_requests_in_queue", (("api", "idle"),))] == 0


def test_requests_run_by_a_node_leave_the_queue_and_count_by_outcome(tmp_path: Path):
    def predict(payload: object, request_id: str) -> object:
        if payload == "fail":
            raise ValueError("no")
        return payload

    harness = Harness(tmp_path, predict)  # its node's clock says 50.0
    for request_id, body in (("r1", b'"ok"'), ("r2", b'"fail"'), ("r3", b'"ok"')):
        harness.submit(request_id, body)
    assert harness.requests.counts("echo", 50.0) == AsyncCounts(in_queue=3)
    harness.runtime.run_request("echo", "r1")
    harness.runtime.run_request("echo", "r2")
    harness.runtime.run_request("echo", "r1")  # delivered again once ended: counted once
    assert harness.requests.counts("echo", 60.0) == AsyncCounts(in_queue=1, completed_per_minute=1,
                                                                failed_per_minute=1)
