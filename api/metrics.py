"""`GET /metrics`: Sluice's figures summed over every process on every host, in Prometheus' format.

Each process counts in memory and adds its counts to Redis about once a second
(`foundation/figures.py`); this collector reads the sums at scrape time, so any API process on any host
answers the same totals, and a restarted process loses nothing that was already sent. Queue
depth is read from the broker at scrape time. No per-process figure is shown: one process's
number presented as Sluice's would be wrong as soon as there are two.

`JOBS_SUBMITTED` and `HTTP_RESPONSES` keep the `labels(...).inc()` form the API's code counts
with; they go to the process's recorder (installed by `create_app`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from foundation import figure_sink as process_figures
from foundation import figures
from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry
from foundation.environment_states import RedisEnvironmentStates
from foundation.errors import JobNotFound
from foundation.figure_store import FigureStore, RedisFigureStore
from foundation.replica_directory import RedisReplicaDirectory, ReplicaDirectory
from foundation.replica_scale import RedisScaleBook
from jobs.asyncapi.counts import AsyncCounts
from jobs.batch.job import job_queue_name
from jobs.placement.asyncapi import Placed
from jobs.placement.host_demand import HostDemand, RedisHostDemandBook
from jobs.services import Services
from jobs.transport.broker import queue_lengths

from .replica_counts import RealtimeCounts, realtime_counts_of

# The hardware queues worker nodes serve; a job's batches wait on a queue of its own
# (`job.<id>`), counted under its hardware queue.
HARDWARE_QUEUES = ("cpu", "gpu", "inf")
QUEUE_DEPTH = ("sluice_queue_depth", "Batches (and completion tasks) waiting in the broker, by hardware queue")
# An AsyncAPI's requests now, from the counts its request store keeps (`jobs/asyncapi/counts.py`).
ASYNC_IN_QUEUE = ("sluice_async_requests_in_queue", "AsyncAPI requests waiting for a worker node, by API")
ASYNC_IN_PROGRESS = ("sluice_async_requests_in_progress", "AsyncAPI requests running on a worker node, by API")
# What the scalers decided (for an AsyncAPI its worker nodes are its replicas: jobs/scaling/asyncapi.py).
REPLICAS = ("sluice_replicas", "Replicas of an API by state (ready: serving; starting: placed, not ready yet; "
            "pending: wanted, no room yet)")
REPLICAS_DESIRED = ("sluice_replicas_desired", "Replicas of an API its scaler wants")
IN_FLIGHT = ("sluice_in_flight", "Requests of an API queued and running that its scaler's last decision saw")
# What placement could not place, and how many hosts each host pool wants (jobs/placement/host_demand.py):
# the figures KEDA scales host pods on (deploy/helm/sluice).
UNPLACED = ("sluice_unplaced", "Worker nodes and replicas that fit on no live host, by host role and hardware")
POOL_HOSTS = ("sluice_host_pool_hosts", "Live hosts of a host pool: busy (holding nodes or replicas) or idle")
POOL_WANTED = ("sluice_host_pool_wanted", "Hosts a host pool wants: its busy ones plus new ones for what is unplaced")
# Per-API environments over every host (`foundation/environment_states.py`): figure name -> (its
# counter in Redis, help).
ENVIRONMENT_COUNTERS = {
    "sluice_environment_builds": ("builds", "API environments built on a host (each host builds each one once)"),
    "sluice_environment_reuses": ("reused", "Times a process found its API's environment already built on its host"),
    "sluice_environment_build_failures": ("failed", "API environment builds that failed (a package that cannot "
                                          "be installed, dependencies.sh exiting non-zero)"),
    "sluice_environment_build_seconds": ("build_seconds", "Seconds spent building API environments"),
}

__all__ = ["CONTENT_TYPE_LATEST", "HTTP_RESPONSES", "JOBS_SUBMITTED", "FiguresCollector", "exposition"]


class _ProcessCounter:
    """A counter of this process's code, sent to the installed recorder (`foundation.figure_sink`)."""

    def __init__(self, figure: figures.Figure) -> None:
        self._figure = figure

    def labels(self, **labels: str) -> _Labelled:
        return _Labelled(self._figure.name, tuple(str(labels[name]) for name in self._figure.labels))


class _Labelled:
    __slots__ = ("_labels", "_name")

    def __init__(self, name: str, labels: tuple[str, ...]) -> None:
        self._name, self._labels = name, labels

    def inc(self, amount: int = 1) -> None:
        process_figures.count(self._name, self._labels, amount)


JOBS_SUBMITTED = _ProcessCounter(figures.JOBS_SUBMITTED)
HTTP_RESPONSES = _ProcessCounter(figures.HTTP_RESPONSES)


def queue_depths(services: Services) -> dict[str, int]:
    """Messages waiting per hardware queue: its own list plus the queues of its active jobs, every
    priority level of each (kombu keeps one Redis list per level)."""
    queue_of: dict[str, str] = {}
    for job_id in services.store.active_ids():
        try:
            queue_of[job_queue_name(job_id)] = services.store.get(job_id).hardware_queue
        except JobNotFound:  # ended (and expired) since it was listed
            continue
    names = [(q, q) for q in HARDWARE_QUEUES] + [(hw, name) for name, hw in queue_of.items()]
    depths = dict.fromkeys(HARDWARE_QUEUES, 0)
    with services.celery.connection_for_write() as conn:
        lengths = queue_lengths(conn.default_channel, [name for _, name in names])
    for hardware, name in names:
        depths[hardware] = depths.get(hardware, 0) + lengths[name]
    return depths


class FiguresCollector(Collector):
    """Yields every figure of `foundation.figures.CATALOGUE` as the figure store holds it, and the
    queue depths (`depths()`, read from the broker at scrape time)."""

    def __init__(self, store: FigureStore, depths: Callable[[], dict[str, int]],
                 async_counts: Callable[[], dict[str, AsyncCounts]] = dict,
                 scaling: Callable[[], dict[str, Placed]] = dict,
                 realtime: Callable[[], dict[str, RealtimeCounts]] = dict,
                 environments: Callable[[], dict[str, float]] = dict,
                 demand: Callable[[], HostDemand | None] = lambda: None) -> None:
        self._store = store
        self._depths = depths
        self._async_counts = async_counts
        self._scaling = scaling
        self._realtime = realtime
        self._environments = environments
        self._demand = demand

    def collect(self) -> Iterator[Metric]:
        totals = figures.read_figures(self._store)
        for figure in figures.CATALOGUE.values():
            yield _family(figure, totals.get(figure.name, {}))
        depth = GaugeMetricFamily(*QUEUE_DEPTH, labels=["queue"])
        for queue, n in sorted(self._depths().items()):
            depth.add_metric([queue], n)
        yield depth
        in_queue = GaugeMetricFamily(*ASYNC_IN_QUEUE, labels=["api"])
        in_progress = GaugeMetricFamily(*ASYNC_IN_PROGRESS, labels=["api"])
        for api, counts in sorted(self._async_counts().items()):
            in_queue.add_metric([api], counts.in_queue)
            in_progress.add_metric([api], counts.in_progress)
        yield in_queue
        yield in_progress
        replicas = GaugeMetricFamily(*REPLICAS, labels=["api", "state"])
        desired = GaugeMetricFamily(*REPLICAS_DESIRED, labels=["api"])
        in_flight = GaugeMetricFamily(*IN_FLIGHT, labels=["api"])
        for api, placed in sorted(self._scaling().items()):
            ready = len(placed.nodes)
            replicas.add_metric([api, "ready"], ready)
            replicas.add_metric([api, "pending"], max(0, placed.desired - ready))
            desired.add_metric([api], placed.desired)
            in_flight.add_metric([api], placed.in_flight)
        for api, realtime in sorted(self._realtime().items()):
            for state, n in realtime.states().items():
                replicas.add_metric([api, state], n)
            desired.add_metric([api], realtime.desired)
            in_flight.add_metric([api], realtime.in_flight)
        yield replicas
        yield desired
        yield in_flight
        yield from _demand_families(self._demand())
        environment_figures = self._environments()
        for name, (field, text) in ENVIRONMENT_COUNTERS.items():
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], environment_figures.get(field, 0.0))
            yield counter


def _demand_families(demand: HostDemand | None) -> Iterator[Metric]:
    """The host figures of beat's last measure (none before its first)."""
    unplaced = GaugeMetricFamily(*UNPLACED, labels=["role", "hardware"])
    hosts = GaugeMetricFamily(*POOL_HOSTS, labels=["pool", "state"])
    wanted = GaugeMetricFamily(*POOL_WANTED, labels=["pool"])
    if demand is not None:
        for (role, hardware), n in sorted(demand.unplaced.items()):
            unplaced.add_metric([role, hardware], n)
        for pool, f in sorted(demand.pools.items()):
            hosts.add_metric([pool, "busy"], f.busy)
            hosts.add_metric([pool, "idle"], f.idle)
            wanted.add_metric([pool], f.wanted)
    yield unplaced
    yield hosts
    yield wanted


def _family(figure: figures.Figure, totals: dict[tuple[str, ...], Any]) -> Metric:
    labels = list(figure.labels)
    if figure.kind is figures.Kind.COUNTER:
        counter = CounterMetricFamily(figure.name, figure.help, labels=labels)
        for values, total in sorted(totals.items()):
            counter.add_metric(list(values), total)
        return counter
    histogram = HistogramMetricFamily(figure.name, figure.help, labels=labels)
    for values, h in sorted(totals.items()):
        histogram.add_metric(list(values), buckets=[(le, float(n)) for le, n in h.buckets], sum_value=h.sum)
    return histogram


def async_counts(services: Services, apis: ApiRegistry, now: float) -> dict[str, AsyncCounts]:
    """Each deployed AsyncAPI's requests queued and in progress (and ended in the last minute)."""
    return {api.name: services.async_requests.counts(api.name, now) for api in apis.all() if api.kind == ApiKind.ASYNC}


def async_scaling(services: Services, apis: ApiRegistry, now: float) -> dict[str, Placed]:
    """Each deployed AsyncAPI's nodes (live ones) and the count its scaler wants."""
    live = services.nodes.live(now)
    deployed = {api.name for api in apis.all() if api.kind == ApiKind.ASYNC}
    return {name: Placed([n for n in placed.nodes if n in live], placed.desired, placed.in_flight)
            for name, placed in services.async_placement.assignments.placed().items() if name in deployed}


def realtime_scaling(services: Services, apis: ApiRegistry, replicas: ReplicaDirectory,
                     now: float) -> dict[str, RealtimeCounts]:
    """Each deployed RealtimeAPI's replicas: wanted, serving, starting and pending, and its in-flight figure."""
    return realtime_counts_of(apis.all(), services.realtime_placement.assignments.all(),
                              RedisScaleBook(services.redis).all(), replicas.live(now))


def exposition(services: Services, store: FigureStore | None = None, apis: ApiRegistry | None = None,
               replicas: ReplicaDirectory | None = None) -> bytes:
    """The text `GET /metrics` answers: the figures in `store` (by default the services' Redis), the
    depths of the services' queues, and (given the registry) each AsyncAPI's queued and running
    requests and every scaled API's replicas."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(
        store or RedisFigureStore(services.redis), lambda: queue_depths(services),
        (lambda: async_counts(services, apis, time.time())) if apis is not None else dict,
        (lambda: async_scaling(services, apis, time.time())) if apis is not None else dict,
        (lambda: realtime_scaling(services, apis, replicas or RedisReplicaDirectory(services.redis), time.time()))
        if apis is not None else dict,
        RedisEnvironmentStates(services.redis).figures,
        RedisHostDemandBook(services.redis).read,
    ))
    return generate_latest(registry)
