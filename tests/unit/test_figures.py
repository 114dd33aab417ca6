"""Figures counted in a process and shown by `/metrics` (`foundation/figures.py`, `api/metrics.py`).

Recorders here count into the in-memory figure store (`foundation.memory.MemoryFigureStore`); what
many processes' counts add up to is the store's contract (`tests/contracts/figure_store.py`), run
against the fake here (tests/unit/test_foundation_fakes.py) and against Redis in
tests/integration/. `/metrics`' text is parsed back with prometheus-client's own parser.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from api.metrics import FiguresCollector
from foundation.figure_store import Increment
from foundation.figures import (
    BATCH_SECONDS,
    BATCHES,
    ITEMS,
    RealtimeFigures,
    Recorder,
    read_figures,
)
from foundation.memory import MemoryFigureStore
from foundation.redis_clients import BACKGROUND
from sluice.proxy_rejections import RejectionTally, parse_table

Parsed = dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]


def scrape(store: MemoryFigureStore, depths: dict[str, int] | None = None) -> Parsed:
    """/metrics' figures as `FiguresCollector` renders them, parsed: family -> (sample, sorted labels) -> value."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(store, lambda: depths or {"cpu": 0, "gpu": 0, "inf": 0}))
    parsed: Parsed = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        samples = parsed.setdefault(family.name, {})
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return parsed


class SignallingStore(MemoryFigureStore):
    """Sets `added` each time a flush reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.added = threading.Event()

    def add(self, increments: Sequence[Increment]) -> None:
        super().add(increments)
        if increments:
            self.added.set()


def test_metrics_shows_the_totals_in_prometheus_text() -> None:
    store = MemoryFigureStore()
    replica_a, replica_b = Recorder(store), Recorder(store)
    RealtimeFigures(replica_a, "iris").answered(200, 0.02)
    RealtimeFigures(replica_b, "iris").answered(200, 0.2)
    RealtimeFigures(replica_b, "iris").answered(503, 0.001)
    replica_a.flush()
    replica_b.flush()
    metrics = scrape(store, {"cpu": 1, "gpu": 3, "inf": 0})
    requests = metrics["sluice_realtime_requests"]
    assert requests[("sluice_realtime_requests_total", (("api", "iris"), ("code", "200")))] == 2
    assert requests[("sluice_realtime_requests_total", (("api", "iris"), ("code", "503")))] == 1
    # a replica's own 503 is a refusal: its predictor was not built
    rejected = metrics["sluice_realtime_rejected"]
    assert rejected == {("sluice_realtime_rejected_total", (("api", "iris"), ("reason", "not_ready"))): 1}
    latency = metrics["sluice_realtime_request_duration_seconds"]
    assert latency[("sluice_realtime_request_duration_seconds_count", (("api", "iris"),))] == 3
    assert latency[("sluice_realtime_request_duration_seconds_bucket", (("api", "iris"), ("le", "0.025")))] == 2
    assert latency[("sluice_realtime_request_duration_seconds_bucket", (("api", "iris"), ("le", "+Inf")))] == 3
    assert latency[("sluice_realtime_request_duration_seconds_sum", (("api", "iris"),))] == pytest.approx(0.221)
    assert metrics["sluice_queue_depth"][("sluice_queue_depth", (("queue", "gpu"),))] == 3
    # every figure is there, counted or not yet
    for name in ("sluice_jobs", "sluice_batches", "sluice_items", "sluice_batch_duration_seconds",
                 "sluice_realtime_batch_size", "sluice_model_loads", "sluice_model_load_seconds", "sluice_queue_depth"):
        assert name in metrics


def test_a_series_needs_exactly_the_figures_labels() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        Recorder(MemoryFigureStore()).counter(BATCHES, "iris")


def test_a_figure_is_counted_as_its_kind() -> None:
    recorder = Recorder(MemoryFigureStore())

    with pytest.raises(TypeError, match="sluice_items_total is a counter, not a histogram"):
        recorder.histogram(ITEMS, "iris")
    with pytest.raises(TypeError, match="is a histogram, not a counter"):
        recorder.count(BATCH_SECONDS.name, ("iris",))


def test_nothing_counted_sends_nothing() -> None:
    store = MemoryFigureStore()
    store.unreachable = True  # were anything sent, the flush would fail

    assert Recorder(store).flush() is True


def test_the_recorders_thread_sends_what_was_counted_every_interval_and_the_rest_at_close() -> None:
    store = SignallingStore()
    recorder = Recorder(store, interval_s=0.01).start()
    try:
        recorder.counter(ITEMS, "iris").inc(3)
        assert store.added.wait(30), "the recorder's thread never flushed"
        assert read_figures(store, [ITEMS])[ITEMS.name] == {("iris",): 3}
        recorder.histogram(BATCH_SECONDS, "iris").observe(1.0)
    finally:
        recorder.close()  # stops the thread and flushes once more
    assert read_figures(store, [ITEMS])[ITEMS.name] == {("iris",): 3}
    totals = read_figures(store, [BATCH_SECONDS])[BATCH_SECONDS.name][("iris",)]
    assert totals.count == 1  # type: ignore[union-attr]


def test_a_recorder_for_a_url_sends_through_a_background_client() -> None:
    recorder = Recorder.for_url("redis://10.0.0.9:6380/2")  # nothing connects until a flush

    options = recorder.store._redis.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    assert (options["host"], options["port"], options["db"]) == ("10.0.0.9", 6380, 2)
    assert options["socket_timeout"] == BACKGROUND.socket_timeout_s
    assert options["retry"].get_retries() == 0  # a failed flush is kept for the next, not repeated


# -- the proxy's own answers ---------------------------------------------------------------------------
TABLE_TEXT = """# table: sluice_rejected, type: string, size:10240, used:2
0x55d7cc029c38: key=iris use=0 exp=0 gpc0=2 gpc1=0 gpc2=3 gpc3=0 gpc4=1
0x55d7cc029c99: key=other-api use=1 exp=0 gpc0=0 gpc1=1 gpc2=0 gpc3=0 gpc4=0
"""


def test_the_refusals_table_is_read_per_api_in_reason_order() -> None:
    assert parse_table(TABLE_TEXT) == {"iris": [2, 0, 3, 0, 1], "other-api": [0, 1, 0, 0, 0]}
    assert parse_table("No such table\n") == {}


def test_only_growth_is_counted_and_a_new_worker_counts_from_zero() -> None:
    tally = RejectionTally()
    assert tally.update({10: {"iris": [2, 0, 3, 0, 0]}}) == {("iris", "overloaded"): 2, ("iris", "request_timeout"): 3}
    assert tally.update({10: {"iris": [2, 0, 3, 0, 0]}}) == {}
    # a reload: the old worker (10) still answers a little, the new one (11) starts at zero
    assert tally.update({10: {"iris": [3, 0, 3, 0, 0]}, 11: {"iris": [1, 1, 0, 0, 0]}}) == {
        ("iris", "overloaded"): 2, ("iris", "not_ready"): 1}
    tally.forget_except({11})
    assert tally.update({11: {"iris": [1, 1, 0, 0, 0]}}) == {}


def test_the_host_figures_show_beats_last_measure_for_keda_to_read() -> None:
    from jobs.placement.host_demand import HostDemand, PoolFigures

    demand = HostDemand({"workers-gpu": PoolFigures(busy=1, idle=2, wanted=3)}, {("workers", "gpu"): 4}, 1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(MemoryFigureStore(), lambda: {"cpu": 0}, demand=lambda: demand))

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples}

    assert samples[("sluice_host_pool_wanted", (("pool", "workers-gpu"),))] == 3
    assert samples[("sluice_host_pool_hosts", (("pool", "workers-gpu"), ("state", "busy")))] == 1
    assert samples[("sluice_host_pool_hosts", (("pool", "workers-gpu"), ("state", "idle")))] == 2
    assert samples[("sluice_unplaced", (("hardware", "gpu"), ("role", "workers")))] == 4
