"""Worker nodes: their heartbeats, the deliveries each holds in flight, and giving those back.

A node announces itself with a heartbeat in Redis (which hardware queues it serves, when it was
last seen). While it runs a batch or a job's completion, the task id of that delivery sits in the
node's in-flight hash, so that if the node dies its unacknowledged message can be put back at the
head of its queue at once (`Nodes.give_back`) instead of after Redis's visibility timeout: a
restarted node does it first thing for its previous life (`jobs/worker_node.py`), a reconnecting
one settles what it held (`jobs/settle.py`), and beat does it for a node silent for
`GIVE_BACK_AFTER_TTLS` node TTLs (`jobs/placement.py`).

A batch enters and leaves its node's in-flight hash inside the job store's own scripts (beginning
and recording a batch, `jobs/store.py`), atomically with its outcome; everything else about
nodes is here. The job store, in turn, owns job records and batch outcomes only.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol

import redis
from celery import Celery

from foundation import keys
from .broker import unacked_tags
from .job import ACTIVE_STATUSES, JobStatus, job_queue_name

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger(__name__)

# Silent this many node TTLs, a node's deliveries are given back (longer than "lost" for
# placement: a predictor holding the GIL misses heartbeats while alive).
GIVE_BACK_AFTER_TTLS = 4
# The in-flight entry of a job's completion task, in place of a batch index.
COMPLETION_ENTRY = "complete"


@dataclass(frozen=True)
class Delivery:
    """Which node runs a batch, and the Celery task id of its message (to give it back if the node dies)."""

    node: str
    task_id: str


def inflight_entry(job_id: str, index: int | str) -> str:
    """What a node's in-flight hash holds for a task: "<job id>:<batch index>" or "<job id>:complete"."""
    return f"{job_id}:{index}"


def job_of_entry(entry: str) -> str:
    """The job id of an in-flight entry (whatever follows it)."""
    return entry.rpartition(":")[0]


def parse_inflight_entry(entry: str) -> tuple[str, int | None]:
    """(job id, batch index), the index None for a completion task."""
    job_id, _, what = entry.rpartition(":")
    return job_id, None if what == COMPLETION_ENTRY else int(what)


def is_job_queue(name: str) -> bool:
    return name.startswith("job.")


def write_heartbeat(client: redis.Redis, node: str, queues: list[str], now: float) -> None:
    """Record that `node` is alive and which hardware queues it serves."""
    record = {"queues": sorted(q for q in queues if not is_job_queue(q)), "seen": now}
    client.hset(keys.NODES, node, json.dumps(record))


def drop_queue(celery: Celery, queue: str) -> None:
    """Delete a job queue with every message still in it (kombu handles priority sub-queues)."""
    with celery.connection_for_write() as conn:
        channel = conn.default_channel
        channel.queue_purge(queue)
        channel.queue_delete(queue)


class JobStatuses(Protocol):
    """What giving back needs of the job store: whether each job is still active."""

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]: ...


class Nodes:
    """The registry of worker nodes and their in-flight deliveries; the Redis client is passed in."""

    def __init__(self, client: redis.Redis, celery: Celery, node_ttl_s: float) -> None:
        self._redis = client
        self._celery = celery
        self.node_ttl_s = node_ttl_s

    # -- heartbeats -------------------------------------------------------------------------
    def heartbeat(self, node: str, queues: list[str], now: float) -> None:
        write_heartbeat(self._redis, node, queues, now)

    def forget(self, node: str) -> None:
        self._redis.hdel(keys.NODES, node)

    def heartbeats(self) -> dict[str, dict[str, Any]]:
        """Node name -> {queues, seen}; an unreadable record is logged and left out, not fatal to the rest."""
        heartbeats = {}
        for raw_name, raw in self._redis.hgetall(keys.NODES).items():
            name = raw_name.decode(errors="replace")
            try:
                record = json.loads(raw)
                heartbeats[name] = {"queues": [str(q) for q in record["queues"]], "seen": float(record["seen"])}
            except (ValueError, TypeError, KeyError) as e:
                log.warning("ignoring the unreadable heartbeat of node %s: %r", name, e)
        return heartbeats

    def live(self, now: float, heartbeats: dict[str, dict[str, Any]] | None = None) -> dict[str, list[str]]:
        """Live node name -> hardware queues it consumes. Long-dead nodes are dropped from the registry."""
        live: dict[str, list[str]] = {}
        for name, record in (self.heartbeats() if heartbeats is None else heartbeats).items():
            age = now - float(record["seen"])
            if age <= self.node_ttl_s:
                live[name] = record["queues"]
            elif age > 20 * self.node_ttl_s:
                self._redis.hdel(keys.NODES, name)
        return live

    def silent_too_long(self, node: str, now: float, heartbeats: dict[str, dict[str, Any]]) -> bool:
        """Whether `node`'s deliveries are to be given back: gone from the registry, or silent
        for GIVE_BACK_AFTER_TTLS node TTLs."""
        record = heartbeats.get(node)
        return record is None or now - float(record["seen"]) > GIVE_BACK_AFTER_TTLS * self.node_ttl_s

    # -- in-flight deliveries ---------------------------------------------------------------
    def begin_delivery(self, delivery: Delivery, entry: str) -> None:
        """Enter a task other than a batch (a job's completion) in its node's in-flight hash."""
        self._redis.hset(keys.inflight(delivery.node), delivery.task_id, entry)

    def end_delivery(self, delivery: Delivery) -> None:
        """Take a delivery that will not be recorded (its job ended) off its node's in-flight hash."""
        self._redis.hdel(keys.inflight(delivery.node), delivery.task_id)

    def inflight(self, node: str) -> dict[str, str]:
        """A node's in-flight deliveries: task id -> "<job id>:<batch index>"."""
        return {k.decode(): v.decode() for k, v in self._redis.hgetall(keys.inflight(node)).items()}

    def inflight_nodes(self) -> list[str]:
        """Nodes with an in-flight hash (live ones, and dead ones whose batches were not given back yet)."""
        return sorted(
            keys.node_of_inflight(raw.decode()) for raw in self._redis.scan_iter(match=keys.INFLIGHT_PATTERN, count=500)
        )

    def forget_inflight(self, node: str, task_ids: Iterable[str]) -> None:
        task_ids = list(task_ids)
        if task_ids:
            self._redis.hdel(keys.inflight(node), *task_ids)

    def jobs_held(self, nodes: "Sequence[str]") -> dict[str, set[str]]:
        """Node -> ids of the jobs it holds deliveries of."""
        return {node: {job_of_entry(e) for e in self.inflight(node).values()} for node in nodes}

    # -- giving back ------------------------------------------------------------------------
    def give_back(self, node: str, jobs: JobStatuses) -> int:
        """Put the deliveries a dead `node` held back at the head of their job queues; returns how many.

        Those of jobs that have ended (per `jobs`, the job store) are dropped with their queue instead.
        """
        entries = self.inflight(node)
        if not entries:
            return 0
        job_ids = {job_of_entry(entry) for entry in entries.values()}
        statuses = jobs.statuses(sorted(job_ids))
        with self._celery.connection_for_write() as conn:
            channel = conn.default_channel
            for tag in unacked_tags(channel, set(entries)).values():
                channel.qos.restore_by_tag(tag)  # to the end BRPOP takes next; a no-op if acknowledged meanwhile
        for job_id in job_ids:
            if statuses.get(job_id) not in ACTIVE_STATUSES:
                drop_queue(self._celery, job_queue_name(job_id))
        self.forget_inflight(node, entries)
        log.warning("gave back %d batch(es) held by node %s: %s", len(entries), node, sorted(entries.values()))
        return len(entries)
