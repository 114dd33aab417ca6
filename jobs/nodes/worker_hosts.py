"""Where worker hosts report the nodes they run, and where beat leaves its plan for them.

An agent (`sluice/worker_host.py`) reports every heartbeat (`WorkerHostReport`) and reads its
host's plan (`HostPlan`); beat reads the reports and writes the plan with the jobs' notes, whole,
in one step (`beat/worker_nodes.py`); the API reads a job's note for its `job_status`.
`WorkerHosts` is what callers type against; `RedisWorkerHosts` keeps it in three Redis hashes,
`jobs.nodes.memory.MemoryWorkerHosts` in dicts for fast tests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import redis

from foundation import keys
from foundation.redis_clients import text
from jobs.placement.node_plan import HostPlan, NodePlan, Shortfall, WorkerHostReport

log = logging.getLogger(__name__)
T = TypeVar("T")


class WorkerHosts(Protocol):
    """Worker hosts' reports, beat's plan for them, and the jobs' notes."""

    def report(self, report: WorkerHostReport) -> None:
        """Write (or rewrite, every heartbeat) what a host's agent runs."""

    def remove(self, host_id: str) -> None:
        """The host's agent stopped cleanly: no report, no plan."""

    def reports(self) -> dict[str, WorkerHostReport]:
        """Host id -> its last report (an unreadable one is logged and left out)."""

    def write_plan(self, plan: NodePlan) -> None:
        """Replace every host's plan and every job's note at once."""

    def plan_of(self, host_id: str) -> HostPlan | None:
        """The host's plan, None when beat has written none for it."""

    def note_of(self, job_id: str) -> str | None:
        """Why the job runs on fewer nodes than it asked, None when it does not."""

    def plans(self) -> dict[str, HostPlan]:
        """Every host's plan as beat last wrote it."""

    def shortfall(self) -> dict[str, Shortfall]:
        """Hardware queue -> the nodes that fit on no live host, as beat last planned."""


class RedisWorkerHosts:
    """`WorkerHosts` in the hashes `keys.WORKER_HOSTS`, `keys.NODE_PLANS`, `keys.JOB_WORKER_NOTES` and
    `keys.NODE_SHORTFALL`."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def report(self, report: WorkerHostReport) -> None:
        self._redis.hset(keys.WORKER_HOSTS, report.host_id, json.dumps(report.to_dict()))

    def remove(self, host_id: str) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(keys.WORKER_HOSTS, host_id)
        pipe.hdel(keys.NODE_PLANS, host_id)
        pipe.execute()

    def _read_all(self, key: str, parse: Callable[[Mapping[str, Any]], T], what: str) -> dict[str, T]:
        """Every field of the hash `key`, parsed; an unreadable one is logged and left out."""
        found = {}
        for raw_field, raw in self._redis.hgetall(key).items():
            try:
                found[text(raw_field)] = parse(json.loads(raw))
            except (ValueError, TypeError, KeyError) as e:
                log.warning("ignoring the unreadable %s %s: %r", what, text(raw_field), e)
        return found

    def reports(self) -> dict[str, WorkerHostReport]:
        return self._read_all(keys.WORKER_HOSTS, WorkerHostReport.from_dict, "report of worker host")

    def write_plan(self, plan: NodePlan) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(keys.NODE_PLANS, keys.JOB_WORKER_NOTES, keys.NODE_SHORTFALL)
        for host_id, host_plan in plan.hosts.items():
            pipe.hset(keys.NODE_PLANS, host_id, json.dumps(host_plan.to_dict()))
        for job_id, note in plan.notes.items():
            pipe.hset(keys.JOB_WORKER_NOTES, job_id, note)
        for queue, short in plan.shortfall.items():
            pipe.hset(keys.NODE_SHORTFALL, queue, json.dumps(short.to_dict()))
        pipe.execute()

    def plan_of(self, host_id: str) -> HostPlan | None:
        raw = self._redis.hget(keys.NODE_PLANS, host_id)
        if raw is None:
            return None
        try:
            return HostPlan.from_dict(json.loads(raw))
        except (ValueError, TypeError, KeyError) as e:
            log.warning("ignoring the unreadable plan of worker host %s: %r", host_id, e)
            return None

    def note_of(self, job_id: str) -> str | None:
        raw = self._redis.hget(keys.JOB_WORKER_NOTES, job_id)
        return None if raw is None else text(raw)

    def plans(self) -> dict[str, HostPlan]:
        return self._read_all(keys.NODE_PLANS, HostPlan.from_dict, "plan of worker host")

    def shortfall(self) -> dict[str, Shortfall]:
        return self._read_all(keys.NODE_SHORTFALL, Shortfall.from_dict, "shortfall of queue")
