"""Settling what a node held when its connection to Redis broke (or its previous process died).

A node's unacknowledged messages are safe while it lives: it acknowledges each after recording
its outcome. But when Redis goes away (a restart, a failover), the recording or the ack can fail,
and the consumer's connection is rebuilt; the message then stays in kombu's unacknowledged hash
and in the node's in-flight hash, and since the node is alive nothing would give it back before
Redis's visibility timeout (an hour by default), when it would run a second time.

So whenever a node's consumer (re)connects, and before its first process consumes anything, it
settles every delivery still in its in-flight hash that it is not running: a batch whose outcome
is recorded (or a completion of a job that has ended) is acknowledged, anything else is given
back to the head of its queue (`Placement.give_back`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import AbstractSet

from .broker import acknowledge_tags, unacked_tags
from .services import Services
from .nodes import parse_inflight_entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """What settling a node's deliveries did: task ids acknowledged, and how many were given back."""

    acknowledged: list[str] = field(default_factory=list)
    given_back: int = 0


def finished_deliveries(services: Services, entries: dict[str, str]) -> set[str]:
    """Those in-flight task ids whose work is already recorded: a batch in its job's done set, or
    the completion of a job that has ended."""
    store = services.store
    by_job: dict[str, dict[str, int | None]] = {}
    for task_id, entry in entries.items():
        job_id, index = parse_inflight_entry(entry)
        by_job.setdefault(job_id, {})[task_id] = index
    statuses = store.statuses(sorted(by_job))
    finished: set[str] = set()
    for job_id, tasks in by_job.items():
        batches = {task_id: index for task_id, index in tasks.items() if index is not None}
        recorded = store.recorded(job_id, batches.values())
        finished.update(task_id for task_id, index in batches.items() if recorded[index])
        status = statuses.get(job_id)
        if status is not None and status.is_terminal:
            finished.update(task_id for task_id, index in tasks.items() if index is None)
    return finished


def settle_deliveries(services: Services, node: str, running: AbstractSet[str] = frozenset()) -> Settled:
    """Acknowledge `node`'s finished deliveries and give back the rest, leaving alone the task ids
    it is `running` (none, for a node of the solo pool whose consumer is reconnecting)."""
    entries = {task_id: entry for task_id, entry in services.nodes.inflight(node).items() if task_id not in running}
    if not entries:
        return Settled()
    if running:  # Placement.give_back takes every entry of a node: leave it to a quieter moment
        log.warning("node %s runs %d task(s); its %d other in-flight deliveries are settled later",
                    node, len(running), len(entries))
        return Settled()
    finished = finished_deliveries(services, entries)
    if finished:
        with services.celery.connection_for_write() as conn:
            channel = conn.default_channel
            acknowledge_tags(channel, unacked_tags(channel, finished).values())
        services.nodes.forget_inflight(node, finished)
        log.warning("node %s acknowledged %d delivery(ies) whose outcome was recorded: %s",
                    node, len(finished), sorted(entries[t] for t in finished))
    given_back = services.placement.give_back(node) if len(finished) < len(entries) else 0
    return Settled(acknowledged=sorted(finished), given_back=given_back)
