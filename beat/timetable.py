"""The maintenance timetable: which steps beat's process runs, in order, and how often.

A new periodic concern is one more `Step` here: a function of `now` and the collaborators it uses
(`beat/steps.py`), handed them here from beat's services.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from foundation.api_registry import RedisApiRegistry
from foundation.hosts import RedisHostDirectory
from foundation.proxy_load import RedisProxyLoadBook
from foundation.replica_scale import RedisScaleBook
from foundation.settings import Settings
from jobs.asyncapi.submit import send_queued_task
from jobs.batch.publish import completion_sender
from jobs.placement.host_demand import RedisHostDemandBook
from jobs.scaling.asyncapi import AsyncScaler
from jobs.scaling.config import autoscaling_of
from jobs.scaling.realtime import RealtimeScaling
from jobs.services import Services

from . import steps
from .completions import completion_grace_s, resend_completions
from .host_demand import HostDemandWatch
from .lost_batches import LostBatchWatch, lost_grace_s
from .lost_requests import LostRequestWatch
from .worker_nodes import plan_worker_nodes


@dataclass(frozen=True)
class Step:
    """One periodic step: `run(services, now)` every `every_s` seconds."""

    name: str
    run: Callable[[Services, float], object]
    every_s: float


def maintenance_steps(settings: Settings) -> list[Step]:
    """Timeouts are judged before placement, so a job ended in this round frees its nodes for the next."""
    every = settings.beat_interval_s
    stale_after_s = settings.enqueue_stale_s
    grace_s = completion_grace_s(settings)
    def check_timeouts(services: Services, now: float) -> object:
        return steps.check_timeouts(services.store, services.placement, now)

    def fail_stalled_enqueues(services: Services, now: float) -> object:
        return steps.fail_stalled_enqueues(services.store, services.placement, now, stale_after_s)

    def reconcile_placement(services: Services, now: float) -> object:
        """Give back dead nodes' batches and keep every active job on live, free nodes (`jobs/placement/batch.py`)."""
        services.placement.reconcile(now)
        return None

    def resend(services: Services, now: float) -> object:
        return resend_completions(services.store, services.store, completion_sender(services.celery), now, grace_s)

    def sweep_async(services: Services, now: float) -> object:
        return steps.sweep_async_requests(services.async_requests, services.request_objects, now)

    def wake_queued(services: Services, now: float) -> object:
        return steps.wake_queued_requests(
            RedisApiRegistry(services.redis), services.async_requests,
            lambda api_name: send_queued_task(services.celery, api_name))

    def plan_nodes(services: Services, now: float) -> object:
        """Start worker nodes where jobs or AsyncAPIs want more than run, on hosts with room
        (`jobs/placement/node_plan.py`)."""
        return plan_worker_nodes(
            services.store, services.nodes, RedisHostDirectory(services.redis), services.worker_hosts,
            RedisApiRegistry(services.redis), services.async_placement.assignments, now, settings.host_ttl_s,
            replicas=services.realtime_placement.assignments)

    scaler = AsyncScaler()  # its samples and recommendations live as long as this process

    def place_async(services: Services, now: float) -> object:
        """Every AsyncAPI on the nodes its scaler wants (`jobs/placement/asyncapi.py`), after the jobs are placed."""
        services.async_placement.reconcile(
            now, lambda api, in_flight, placed, at: scaler.wanted(api, autoscaling_of(api), in_flight, placed, at))
        return None

    realtime = RealtimeScaling()  # its baselines, samples and recommendations live as long as this process

    def scale_realtime(services: Services, now: float) -> object:
        """Every RealtimeAPI's replica count from the proxies' in-flight figures, into the scale book
        (`jobs/scaling/realtime.py`), where placement reads it."""
        return realtime.step(RedisApiRegistry(services.redis), RedisProxyLoadBook(services.redis),
                             RedisScaleBook(services.redis), now)

    def place_realtime(services: Services, now: float) -> object:
        """Every RealtimeAPI's replicas on the live hosts' room (`jobs/placement/realtime.py`)."""
        services.realtime_placement.reconcile(now)
        return None

    demand = HostDemandWatch(settings.host_pools, settings.host_ttl_s)

    def measure_demand(services: Services, now: float) -> object:
        """How many hosts each host pool wants, for what placement could not place (`jobs/placement/host_demand.py`)."""
        return demand.step(RedisHostDirectory(services.redis), services.worker_hosts, services.realtime_placement,
                           RedisHostDemandBook(services.redis), now)

    return [
        Step("check-timeouts", check_timeouts, every),
        Step("fail-stalled-enqueues", fail_stalled_enqueues, every),
        Step("reconcile-placement", reconcile_placement, every),
        Step("place-async-apis", place_async, every),
        Step("plan-worker-nodes", plan_nodes, every),
        Step("scale-realtime-apis", scale_realtime, every),
        Step("place-realtime-replicas", place_realtime, every),
        Step("measure-host-demand", measure_demand, every),
        Step("resend-completions", resend, every),
        Step("recover-lost-batches", LostBatchWatch(lost_grace_s(settings)), every),
        Step("sweep-async-requests", sweep_async, every),
        Step("wake-queued-async-requests", wake_queued, every),
        Step("recover-lost-async-requests", LostRequestWatch(lost_grace_s(settings)), every),
    ]
