"""The figure store's contract (`foundation.figure_store.FigureStore`), and what `Recorder` and
`read_figures` make of it: figures counted in many processes read back as one total.

Each `Recorder` stands for one process; they share one store as Sluice's processes share Redis.
Fixtures a subclass provides: `store` (empty) and `unreachable_store` (one that cannot be reached).
"""

from __future__ import annotations

import pytest
import redis

from foundation import figure_sink as process_figures
from foundation import figures
from foundation.figure_store import FigureStore, Increment
from foundation.figures import (
    BATCH_SECONDS,
    BATCHES,
    ITEMS,
    REALTIME_REQUESTS,
    HistogramTotals,
    RealtimeFigures,
    Recorder,
    read_figures,
)


class FigureStoreContract:
    # -- the store itself ---------------------------------------------------------------------------
    def test_increments_add_up_per_field_and_read_back_in_the_order_asked(self, store: FigureStore) -> None:
        store.add([Increment("a", "x", 2), Increment("a", "x", 3), Increment("a", "sum", 0.25)])
        store.add([Increment("b", "y", 1), Increment("a", "sum", 0.5)])

        assert store.read(["b", "a", "never-added"]) == [{"y": 1.0}, {"x": 5.0, "sum": 0.75}, {}]
        assert store.read([]) == []
        store.add([])

    def test_a_store_that_cannot_be_reached_raises_a_connection_error(self, unreachable_store: FigureStore) -> None:
        with pytest.raises(redis.ConnectionError):
            unreachable_store.add([Increment("a", "x", 1)])
        with pytest.raises(redis.ConnectionError):
            unreachable_store.read(["a"])

    # -- recorders over it --------------------------------------------------------------------------
    def test_counts_of_two_processes_add_up_to_one_total(self, store: FigureStore) -> None:
        first, second = Recorder(store), Recorder(store)
        first.counter(BATCHES, "iris", "succeeded").inc()
        first.counter(BATCHES, "iris", "succeeded").inc(2)
        second.counter(BATCHES, "iris", "succeeded").inc(4)
        second.counter(BATCHES, "iris", "failed").inc()
        second.count(ITEMS.name, ("iris",), 50)
        assert first.flush() and second.flush()
        first.counter(BATCHES, "iris", "succeeded").inc()  # counted after the flush: sent by the next one
        totals = read_figures(store)
        assert totals[BATCHES.name] == {("iris", "succeeded"): 7, ("iris", "failed"): 1}
        assert totals[ITEMS.name] == {("iris",): 50}
        assert first.flush()
        assert read_figures(store)[BATCHES.name][("iris", "succeeded")] == 8

    def test_a_flush_sends_each_count_once(self, store: FigureStore) -> None:
        recorder = Recorder(store)
        recorder.counter(ITEMS, "iris").inc(3)
        assert recorder.flush() and recorder.flush() and recorder.flush()
        assert read_figures(store)[ITEMS.name] == {("iris",): 3}

    def test_histograms_of_two_processes_are_summed_into_cumulative_buckets(self, store: FigureStore) -> None:
        bounds = BATCH_SECONDS.buckets
        first, second = Recorder(store), Recorder(store)
        for value in (0.001, bounds[0], 0.3):  # a bucket's own bound belongs to it (le means <=)
            first.histogram(BATCH_SECONDS, "iris").observe(value)
        for value in (0.3, 10_000.0):  # beyond the last bound: only in +Inf
            second.histogram(BATCH_SECONDS, "iris").observe(value)
        first.flush()
        second.flush()
        [(labels, totals)] = read_figures(store)[BATCH_SECONDS.name].items()
        assert labels == ("iris",) and isinstance(totals, HistogramTotals)
        buckets = dict(totals.buckets)
        assert list(buckets) == [repr(b) for b in bounds] + ["+Inf"]
        assert buckets[repr(bounds[0])] == 2
        assert buckets["0.25"] == 2 and buckets["0.5"] == 4
        assert buckets[repr(bounds[-1])] == 4 and buckets["+Inf"] == 5 == totals.count
        assert totals.sum == pytest.approx(0.001 + bounds[0] + 0.3 + 0.3 + 10_000.0)
        counts = list(buckets.values())
        assert counts == sorted(counts)  # cumulative

    def test_a_replicas_requests_count_by_code_with_their_latency_and_its_own_refusals(
        self, store: FigureStore,
    ) -> None:
        replica_a, replica_b = Recorder(store), Recorder(store)
        RealtimeFigures(replica_a, "iris").answered(200, 0.02)
        RealtimeFigures(replica_b, "iris").answered(200, 0.2)
        RealtimeFigures(replica_b, "iris").answered(503, 0.001)  # before the predictor was built: a refusal
        RealtimeFigures(replica_b, "iris").answered(500, None)  # not timed
        replica_a.flush()
        replica_b.flush()
        totals = read_figures(store)
        assert totals[REALTIME_REQUESTS.name] == {("iris", "200"): 2, ("iris", "503"): 1, ("iris", "500"): 1}
        assert totals[figures.REALTIME_REJECTED.name] == {("iris", "not_ready"): 1}
        latency = totals[figures.REALTIME_SECONDS.name][("iris",)]
        assert isinstance(latency, HistogramTotals)
        assert latency.count == 3 and latency.sum == pytest.approx(0.221)
        assert dict(latency.buckets)["0.025"] == 2

    def test_the_process_sink_reaches_the_installed_recorder_and_nothing_without_one(self, store: FigureStore) -> None:
        recorder = Recorder(store)
        process_figures.install(None)
        process_figures.count(figures.MODEL_LOADS.name, ("iris", "_default"))  # dropped
        process_figures.install(recorder)
        try:
            process_figures.count(figures.MODEL_LOADS.name, ("iris", "_default"))
            process_figures.observe(figures.MODEL_LOAD_SECONDS.name, ("iris",), 1.5)
        finally:
            process_figures.install(None)
        recorder.flush()
        totals = read_figures(store)
        assert totals[figures.MODEL_LOADS.name] == {("iris", "_default"): 1}
        model_seconds = totals[figures.MODEL_LOAD_SECONDS.name][("iris",)]
        assert isinstance(model_seconds, HistogramTotals) and model_seconds.count == 1

    def test_a_failed_flush_keeps_its_counts_for_the_next(
        self, store: FigureStore, unreachable_store: FigureStore,
    ) -> None:
        recorder = Recorder(unreachable_store)
        recorder.counter(REALTIME_REQUESTS, "iris", "200").inc(5)
        recorder.histogram(BATCH_SECONDS, "iris").observe(1.0)
        assert recorder.flush() is False
        recorder.histogram(BATCH_SECONDS, "iris").observe(2.0)  # counted while the store was away
        recorder.store = store  # the store is back
        assert recorder.flush() is True
        totals = read_figures(store)
        assert totals[REALTIME_REQUESTS.name] == {("iris", "200"): 5}
        batch_seconds = totals[BATCH_SECONDS.name][("iris",)]
        assert isinstance(batch_seconds, HistogramTotals)
        assert batch_seconds.count == 2 and batch_seconds.sum == 3.0

    def test_label_values_of_any_text_survive_the_round_trip(self, store: FigureStore) -> None:
        recorder = Recorder(store)
        recorder.counter(figures.MODEL_LOADS, 'we|ird "api"', "mo/del\n").inc()
        recorder.flush()
        assert read_figures(store)[figures.MODEL_LOADS.name] == {('we|ird "api"', "mo/del\n"): 1}

    def test_fields_that_are_not_sluices_are_left_out_of_the_totals(self, store: FigureStore) -> None:
        store.add([Increment(ITEMS.key, "not json", 1), Increment(ITEMS.key, '["a","b"]', 1),
                   Increment(BATCH_SECONDS.key, '["iris"]|not-a-bound', 1), Increment(ITEMS.key, '["iris"]', 2)])

        totals = read_figures(store, [ITEMS, BATCH_SECONDS])

        assert totals == {ITEMS.name: {("iris",): 2}, BATCH_SECONDS.name: {}}
