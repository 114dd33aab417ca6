"""Sluice's figures (what `GET /metrics` shows), gathered in Redis from every process on every host.

A figure counted in one process would be that process's number, not Sluice's: the API runs
several gunicorn processes, each replica several more, and workers run on many hosts. So every
process keeps its counts in memory (`Recorder`) and adds them, as deltas, to a figure store (one
Redis hash per figure: `foundation/figure_store.py`) in the background about once a second (and
at exit); the management API's `/metrics` reads the sums (`read_figures`) and shows them whole
(`api/metrics.py`). Nothing waits on Redis where a figure is counted, so a realtime request pays
a lock and a few additions, not a round trip.

A fast test hands a `Recorder` a `foundation.memory.MemoryFigureStore` and reads the totals back
with `read_figures` as `/metrics` does.

Stored form, one hash per figure (`keys.figure(name)`):
- a counter: field = the label values as a compact JSON list, value = the count;
- a histogram: field `<labels>|<le>` = observations in the bucket up to `le` (not cumulative;
  `le` as `repr(float)`, or `+Inf`), field `<labels>|sum` = the sum of the observations.

Label values are JSON so that any text is safe in them; the job store counts jobs that end
inside its transition script (`jobs/store/lua/transition.lua`: exactly once, whoever ends the
job), writing the same form.

A process killed outright loses what it counted in its last second; a flush whose reply is lost
to a Redis failure may be sent again. Figures are for watching trends, not for accounting.
"""

from __future__ import annotations

import atexit
import bisect
import json
import logging
import math
import os
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import redis

from . import keys
from .figure_store import FigureStore, Increment, RedisFigureStore
from .redis_clients import BACKGROUND, client
from .settings import RedisAddress

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 1.0
INF = "+Inf"


class Kind(StrEnum):
    COUNTER = "counter"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Figure:
    """One figure: its Prometheus name, what it means, its labels and (histograms) bucket bounds."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def key(self) -> str:
        return keys.figure(self.name)


_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
_REQUEST_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SIZES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)

# Counted inside the job store's status-change script (exactly once, whoever ends the job).
ENDED_JOBS = "sluice_jobs_total"
JOBS = Figure(ENDED_JOBS, Kind.COUNTER, "Batch jobs ended, by final status", ("api", "status"))
JOBS_SUBMITTED = Figure("sluice_jobs_submitted_total", Kind.COUNTER, "Batch jobs submitted", ("api",))
BATCHES = Figure("sluice_batches_total", Kind.COUNTER, "Batches recorded, by outcome (succeeded or failed)",
                 ("api", "status"))
ITEMS = Figure("sluice_items_total", Kind.COUNTER, "Items in recorded batches (succeeded or failed)", ("api",))
BATCH_SECONDS = Figure("sluice_batch_duration_seconds", Kind.HISTOGRAM,
                       "Time a batch took on its worker, every try included", ("api",), _SECONDS)
REALTIME_REQUESTS = Figure("sluice_realtime_requests_total", Kind.COUNTER,
                           "Realtime requests answered, by HTTP status (by a replica or by the proxy)",
                           ("api", "code"))
REALTIME_SECONDS = Figure("sluice_realtime_request_duration_seconds", Kind.HISTOGRAM,
                          "Time a replica took to answer a realtime request", ("api",), _REQUEST_SECONDS)
REALTIME_BATCH_SIZE = Figure("sluice_realtime_batch_size", Kind.HISTOGRAM,
                             "Requests per server-side batch (tensorflow: client calls per run of the model)",
                             ("api",), _SIZES)
REALTIME_REJECTED = Figure("sluice_realtime_rejected_total", Kind.COUNTER,
                           "Realtime requests refused without a prediction, by reason", ("api", "reason"))
MODEL_LOADS = Figure("sluice_model_loads_total", Kind.COUNTER, "Model versions downloaded and loaded",
                     ("api", "model"))
MODEL_LOAD_SECONDS = Figure("sluice_model_load_seconds", Kind.HISTOGRAM,
                            "Time to download (when not cached on disk) and load a model version", ("api",),
                            _SECONDS)
# Counted inside the AsyncAPI request store's scripts (exactly once, whichever node ends the request).
ASYNC_REQUESTS = Figure("sluice_async_requests_total", Kind.COUNTER,
                        "AsyncAPI requests ended, by outcome (completed or failed)", ("api", "status"))
ASYNC_SECONDS = Figure("sluice_async_request_duration_seconds", Kind.HISTOGRAM,
                       "Time from an AsyncAPI request's submission to its outcome (server timestamps)", ("api",),
                       _SECONDS)
# Counted by the proxy controllers from haproxy's own counters (sluice/proxy_splits.py).
SPLIT_REQUESTS = Figure("sluice_traffic_split_requests_total", Kind.COUNTER,
                        "Requests a TrafficSplitter sent to each of its APIs (copies to its shadow included)",
                        ("splitter", "api"))
UNREADABLE_MESSAGES = Figure("sluice_unreadable_messages_total", Kind.COUNTER,
                             "Broker messages neither Sluice nor Celery could read, rejected without requeue",
                             ("task",))
HTTP_RESPONSES = Figure("sluice_http_responses_total", Kind.COUNTER,
                        "Responses of the management API, by status class", ("status",))

CATALOGUE: dict[str, Figure] = {f.name: f for f in (
    JOBS, JOBS_SUBMITTED, BATCHES, ITEMS, BATCH_SECONDS, REALTIME_REQUESTS, REALTIME_SECONDS, REALTIME_BATCH_SIZE,
    REALTIME_REJECTED, MODEL_LOADS, MODEL_LOAD_SECONDS, ASYNC_REQUESTS, ASYNC_SECONDS, SPLIT_REQUESTS,
    UNREADABLE_MESSAGES, HTTP_RESPONSES,
)}


def label_field(labels: Iterable[str]) -> str:
    """The hash field of one label set: its values as a compact JSON list."""
    return json.dumps([str(v) for v in labels], separators=(",", ":"))


def le_label(bound: float) -> str:
    """A histogram bucket's bound as its stored field and Prometheus' `le` spell it."""
    return _le(bound)


def _le(bound: float) -> str:
    return INF if math.isinf(bound) else repr(float(bound))


# -- counting --------------------------------------------------------------------------------------
class CounterSeries:
    """One counter with its labels fixed; `inc` is cheap enough for every realtime request."""

    __slots__ = ("_recorder", "field", "key", "pending")

    def __init__(self, recorder: Recorder, figure: Figure, labels: tuple[str, ...]) -> None:
        self._recorder = recorder
        self.key = figure.key
        self.field = label_field(labels)
        self.pending = 0

    def inc(self, amount: int = 1) -> None:
        with self._recorder.lock:
            self.pending += amount


class HistogramSeries:
    """One histogram with its labels fixed: bucket counts and the sum, until the next flush."""

    __slots__ = ("_recorder", "bounds", "counts", "fields", "key", "sum", "sum_field")

    def __init__(self, recorder: Recorder, figure: Figure, labels: tuple[str, ...]) -> None:
        self._recorder = recorder
        self.key = figure.key
        self.bounds = figure.buckets
        prefix = label_field(labels) + "|"
        self.fields = [prefix + _le(b) for b in (*figure.buckets, math.inf)]
        self.sum_field = prefix + "sum"
        self.counts = [0] * (len(figure.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)  # the first bucket whose bound is >= value
        with self._recorder.lock:
            self.counts[index] += 1
            self.sum += value


Series = CounterSeries | HistogramSeries
S = TypeVar("S", CounterSeries, HistogramSeries)
# What a series counted since the last flush: a counter's count, or a histogram's bucket counts and sum.
Deltas = int | tuple[list[int], float]

_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()
_fork_hook_registered = False


def _after_fork_in_child() -> None:
    for recorder in list(_RECORDERS):
        recorder._after_fork()


class Recorder:
    """A process's figures: counted in memory, added to a figure store by a daemon thread (and at exit).

    `counter(figure, *labels)` / `histogram(figure, *labels)` give series to count on; `count` and
    `observe` by figure name serve code that has no series at hand (`foundation.figure_sink`).
    A forked child starts with nothing pending (its parent sends its own counts).
    """

    def __init__(self, store: FigureStore, interval_s: float = FLUSH_INTERVAL_S) -> None:
        global _fork_hook_registered
        self.store = store
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self._series: dict[tuple[str, tuple[str, ...]], Series] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        _RECORDERS.add(self)
        if not _fork_hook_registered:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _fork_hook_registered = True

    @classmethod
    def for_url(cls, url: str | RedisAddress, interval_s: float = FLUSH_INTERVAL_S) -> Recorder:
        """A recorder adding to the Redis at `url` (or `Settings.redis_address`) with a background
        client of its own: no retries inside a flush (a failed flush is kept and sent with the
        next), short timeouts so that exit is never held up for long (`foundation.redis_clients.BACKGROUND`)."""
        return cls(RedisFigureStore(client(url, BACKGROUND)), interval_s)

    # series
    def counter(self, figure: Figure, *labels: str) -> CounterSeries:
        return self._get(figure, labels, Kind.COUNTER, CounterSeries)

    def histogram(self, figure: Figure, *labels: str) -> HistogramSeries:
        return self._get(figure, labels, Kind.HISTOGRAM, HistogramSeries)

    def _get(self, figure: Figure, labels: tuple[str, ...], kind: Kind, series_type: type[S]) -> S:
        if figure.kind is not kind:
            raise TypeError(f"{figure.name} is a {figure.kind.value}, not a {kind.value}")
        if len(labels) != len(figure.labels):
            raise ValueError(f"{figure.name} takes labels {figure.labels}, got {labels!r}")
        key = (figure.name, labels)
        series = self._series.get(key)
        if series is None:
            with self.lock:
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = series_type(self, figure, labels)
        assert isinstance(series, series_type)  # one figure, one kind
        return series

    # by name (foundation.figure_sink.FigureSink)
    def count(self, name: str, labels: tuple[str, ...], amount: int = 1) -> None:
        self.counter(CATALOGUE[name], *labels).inc(amount)

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        self.histogram(CATALOGUE[name], *labels).observe(value)

    # sending
    def _take(self) -> list[tuple[Series, Deltas]]:
        """What was counted since the last flush, taken out of the series: (series, its deltas)."""
        taken: list[tuple[Series, Deltas]] = []
        with self.lock:
            for series in self._series.values():
                if isinstance(series, CounterSeries):
                    if series.pending:
                        taken.append((series, series.pending))
                        series.pending = 0
                elif series.sum or any(series.counts):
                    taken.append((series, (series.counts, series.sum)))
                    series.counts = [0] * len(series.counts)
                    series.sum = 0.0
        return taken

    def _give_back(self, taken: list[tuple[Series, Deltas]]) -> None:
        """A flush failed: keep its deltas for the next one."""
        with self.lock:
            for series, deltas in taken:
                if isinstance(series, CounterSeries):
                    assert isinstance(deltas, int)
                    series.pending += deltas
                else:
                    assert isinstance(deltas, tuple)
                    counts, total = deltas
                    series.counts = [a + b for a, b in zip(series.counts, counts, strict=True)]
                    series.sum += total

    @staticmethod
    def _increments(taken: list[tuple[Series, Deltas]]) -> list[Increment]:
        increments: list[Increment] = []
        for series, deltas in taken:
            if isinstance(series, CounterSeries):
                assert isinstance(deltas, int)
                increments.append(Increment(series.key, series.field, deltas))
                continue
            assert isinstance(deltas, tuple)
            counts, total = deltas
            increments.extend(
                Increment(series.key, field, n) for field, n in zip(series.fields, counts, strict=True) if n
            )
            increments.append(Increment(series.key, series.sum_field, float(total)))
        return increments

    def flush(self) -> bool:
        """Add what was counted since the last flush to the store, in one round trip; False if it failed."""
        taken = self._take()
        if not taken:
            return True
        try:
            self.store.add(self._increments(taken))
        except redis.RedisError as e:
            self._give_back(taken)
            if not self._failing:
                log.warning("sending figures to Redis failed (kept for the next try): %s: %s", type(e).__name__, e)
            self._failing = True
            return False
        self._failing = False
        return True

    def start(self) -> Recorder:
        """Flush every `interval_s` in a daemon thread, and once more at exit; idempotent."""
        if self._thread is None or not self._thread.is_alive():
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,), daemon=True,
                                            name="sluice-figures")
            self._thread.start()
            atexit.register(self.close)
        return self

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # never let the thread die: the next turn sends what is left
                log.exception("sending figures failed")

    def close(self) -> None:
        """Stop the thread and send what is left (best effort)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval_s + 5)
        self._thread = None
        try:
            self.flush()
        except Exception:
            log.exception("sending the last figures failed")

    def _after_fork(self) -> None:
        was_running = self._thread is not None
        self.lock = threading.Lock()
        for series in self._series.values():
            if isinstance(series, CounterSeries):
                series.pending = 0
            else:
                series.counts = [0] * len(series.counts)
                series.sum = 0.0
        self._thread = None
        if was_running:
            self.start()


# -- reading ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HistogramTotals:
    """One label set of a histogram, summed over every process: cumulative buckets, sum, count."""

    buckets: list[tuple[str, int]]  # (le, observations <= le), ascending, ending with +Inf
    sum: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


def _labels_of(raw: str, width: int) -> tuple[str, ...] | None:
    try:
        values = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(values, list) or len(values) != width:
        return None
    return tuple(str(v) for v in values)


def _counter_totals(figure: Figure, raw: dict[str, float]) -> dict[tuple[str, ...], float]:
    totals: dict[tuple[str, ...], float] = {}
    for field, value in raw.items():
        labels = _labels_of(field, len(figure.labels))
        if labels is not None:
            totals[labels] = totals.get(labels, 0) + float(value)
    return totals


def _histogram_totals(figure: Figure, raw: dict[str, float]) -> dict[tuple[str, ...], HistogramTotals]:
    per_le: dict[tuple[str, ...], dict[float, int]] = {}
    sums: dict[tuple[str, ...], float] = {}
    for field, value in raw.items():
        head, _, tail = field.rpartition("|")
        labels = _labels_of(head, len(figure.labels))
        if labels is None:
            continue
        if tail == "sum":
            sums[labels] = sums.get(labels, 0.0) + float(value)
            continue
        try:
            bound = math.inf if tail == INF else float(tail)
        except ValueError:
            continue
        buckets = per_le.setdefault(labels, {})
        buckets[bound] = buckets.get(bound, 0) + int(value)
    totals = {}
    for labels in per_le.keys() | sums.keys():
        counts = per_le.get(labels, {})
        bounds = sorted({*figure.buckets, *counts, math.inf})  # every bucket shown, empty or not
        running = 0
        cumulative: list[tuple[str, int]] = []
        for bound in bounds:
            running += counts.get(bound, 0)
            cumulative.append((_le(bound), running))
        totals[labels] = HistogramTotals(cumulative, sums.get(labels, 0.0))
    return totals


# A figure's totals: label values -> a number (a counter) or `HistogramTotals` (a histogram).
Totals = dict[tuple[str, ...], float] | dict[tuple[str, ...], HistogramTotals]


def read_figures(store: FigureStore, figures: Iterable[Figure] = CATALOGUE.values()) -> dict[str, Totals]:
    """Every figure's totals over all processes, in one round trip: figure name -> labels -> total
    (a number for a counter, `HistogramTotals` for a histogram)."""
    wanted = list(figures)
    result: dict[str, Totals] = {}
    for figure, raw in zip(wanted, store.read([figure.key for figure in wanted]), strict=True):
        if figure.kind is Kind.COUNTER:
            result[figure.name] = _counter_totals(figure, raw)
        else:
            result[figure.name] = _histogram_totals(figure, raw)
    return result


# -- a replica's requests --------------------------------------------------------------------------
# A replica's own refusals (it runs nothing for them): 503 before its predictor is built, 504 when
# the request's deadline passed (before its turn, or while its batch ran).
REPLICA_REJECTIONS = {503: "not_ready", 504: "request_timeout"}


class RealtimeFigures:
    """One replica process's per-request figures, series made once so that a request only adds."""

    def __init__(self, recorder: Recorder, api: str) -> None:
        self._recorder = recorder
        self.api = api
        self._codes: dict[int, CounterSeries] = {}
        self._seconds = recorder.histogram(REALTIME_SECONDS, api)
        self._rejected = {code: recorder.counter(REALTIME_REJECTED, api, reason)
                          for code, reason in REPLICA_REJECTIONS.items()}

    def answered(self, code: int, seconds: float | None) -> None:
        """A request was answered with `code` after `seconds` (None: not timed)."""
        series = self._codes.get(code)
        if series is None:
            series = self._codes[code] = self._recorder.counter(REALTIME_REQUESTS, self.api, str(code))
        series.inc()
        if seconds is not None:
            self._seconds.observe(seconds)
        rejected = self._rejected.get(code)
        if rejected is not None:
            rejected.inc()
