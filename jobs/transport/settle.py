"""Settling what a node held: giving a dead node's deliveries back, and a reconnecting node's own.

A node's unacknowledged messages are safe while it lives: it acknowledges each after recording
its outcome. But a node can die mid-batch (killed, out of memory, ended by its watchdog), or lose
Redis (a restart, a failover) so that the recording or the ack fails and the consumer's connection
is rebuilt. The message then stays in kombu's unacknowledged hash and in the node's in-flight hash,
and nothing would give it back before Redis's visibility timeout (an hour by default), when it
would run a second time.

So `give_back` puts what a dead node held back at the head of its queues (beat, for a node silent
too long: `jobs/placement/batch.py`), and whenever a node's consumer (re)connects, before it consumes
anything, `settle_deliveries` acknowledges every delivery in its in-flight hash whose work is
recorded (a batch in its job's done set, or a completion of a job that has ended) and gives back
the rest (`jobs/nodes/worker_node.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Set
from dataclasses import dataclass, field

from jobs.batch.job import ACTIVE_STATUSES, job_queue_name
from jobs.nodes.registry import NodeRegistry
from jobs.store import BatchLedger, JobRecords
from jobs.transport.delivery import is_request_entry, job_of_entry, parse_inflight_entry
from jobs.transport.queues import JobQueues

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settled:
    """What settling a node's deliveries did: task ids acknowledged, and how many were given back."""

    acknowledged: list[str] = field(default_factory=list)
    given_back: int = 0


def give_back(node: str, nodes: NodeRegistry, records: JobRecords, queues: JobQueues) -> int:
    """Put the deliveries a dead `node` held back at the head of their job queues; returns how many.

    Those of jobs that have ended are dropped with their queue instead.
    """
    entries = nodes.inflight(node)
    if not entries:
        return 0
    job_ids = {job_of_entry(entry) for entry in entries.values() if not is_request_entry(entry)}
    statuses = records.statuses(sorted(job_ids))
    queues.give_back(set(entries))
    for job_id in job_ids:
        if statuses.get(job_id) not in ACTIVE_STATUSES:
            queues.drop(job_queue_name(job_id))
    nodes.forget_inflight(node, entries)
    log.warning("gave back %d batch(es) held by node %s: %s", len(entries), node, sorted(entries.values()))
    return len(entries)


def finished_deliveries(records: JobRecords, ledger: BatchLedger, entries: dict[str, str]) -> set[str]:
    """Those in-flight task ids whose work is already recorded: a batch in its job's done set, or
    the completion of a job that has ended."""
    by_job: dict[str, dict[str, int | None]] = {}
    for task_id, entry in entries.items():
        if is_request_entry(entry):  # given back: its next delivery acknowledges an ended request
            continue
        job_id, index = parse_inflight_entry(entry)
        by_job.setdefault(job_id, {})[task_id] = index
    statuses = records.statuses(sorted(by_job))
    finished: set[str] = set()
    for job_id, tasks in by_job.items():
        batches = {task_id: index for task_id, index in tasks.items() if index is not None}
        recorded = ledger.recorded(job_id, batches.values())
        finished.update(task_id for task_id, index in batches.items() if recorded[index])
        status = statuses.get(job_id)
        if status is not None and status.is_terminal:
            finished.update(task_id for task_id, index in tasks.items() if index is None)
    return finished


def settle_deliveries(
    node: str, nodes: NodeRegistry, records: JobRecords, ledger: BatchLedger, queues: JobQueues,
    running: Set[str] = frozenset(),
) -> Settled:
    """Acknowledge `node`'s finished deliveries and give back the rest, leaving alone the task ids
    it is `running` (none, for a node of the solo pool whose consumer is reconnecting)."""
    entries = {task_id: entry for task_id, entry in nodes.inflight(node).items() if task_id not in running}
    if not entries:
        return Settled()
    if running:  # give_back takes every entry of a node: leave it to a quieter moment
        log.warning("node %s runs %d task(s); its %d other in-flight deliveries are settled later",
                    node, len(running), len(entries))
        return Settled()
    finished = finished_deliveries(records, ledger, entries)
    if finished:
        queues.acknowledge(finished)
        nodes.forget_inflight(node, finished)
        log.warning("node %s acknowledged %d delivery(ies) whose outcome was recorded: %s",
                    node, len(finished), sorted(entries[t] for t in finished))
    given_back = give_back(node, nodes, records, queues) if len(finished) < len(entries) else 0
    return Settled(acknowledged=sorted(finished), given_back=given_back)
