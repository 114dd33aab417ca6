"""Placement: which worker nodes serve which job, so that `workers` means what it did in Cortex.

Each job's batches travel on a queue of their own (`job.<id>`). A worker node is one
predictor process (the app runs with `worker_concurrency = 1`); the job runs on at most
`workers` nodes because only that many are told to consume its queue (Celery's
`add_consumer`). Nodes announce themselves with a heartbeat in Redis; a reconcile step,
run in beat's own process (never on a node, whose predictor may hang), moves a lost node's share
to a live one and re-sends the consumer commands, which are idempotent, so a missed broadcast
heals itself. A node still running a batch of a job that has ended (a hung predictor, until its
watchdog ends the process: `jobs/batch/time_limit.py`) is not chosen for another job.

Heartbeats and the batches each node holds in flight belong to `jobs/nodes/registry.py`, giving back a
dead node's batches to `jobs/transport/settle.py` (the reconcile step here calls it for nodes silent too
long), and the broadcasts to `jobs/transport/queues.py`. `JobPlacement` is what callers ask; `Placement`
does it over any job records, node registry and job queues, Redis's or the in-memory ones, and
passes the same contract tests on both.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Set
from typing import Protocol

import redis
from kombu.exceptions import KombuError

from foundation.errors import JobNotFound
from jobs.batch.job import ACTIVE_STATUSES, BAD_RECORD_ERRORS, Job, JobStatus
from jobs.nodes.registry import Heartbeats, NodeRegistry, jobs_held, silent_too_long
from jobs.store import JobRecords
from jobs.transport.queues import JobQueues
from jobs.transport.settle import give_back

log = logging.getLogger(__name__)


class JobPlacement(Protocol):
    """Which nodes serve which job, as the enqueuer, the batch path, beat and the API ask it."""

    def assign(self, job: Job, now: float) -> list[str]:
        """Give a new job its nodes (least loaded first) and tell them to consume its queue."""

    def reconcile(self, now: float) -> None:
        """One step of the placement loop (beat's)."""

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        """A job has ended: its nodes stop consuming its queue and anything left in it is dropped."""

    def drop_queue(self, queue: str) -> None:
        """Delete a job queue with every message still in it."""

    def live_nodes(self, now: float, heartbeats: Heartbeats | None = None) -> dict[str, list[str]]:
        """Live node name -> hardware queues it consumes."""

    def assigned_queues(self, node: str) -> list[str]:
        """Queues of the active jobs placed on `node`."""

    def load(self) -> Counter[str]:
        """How many active jobs each node serves."""


class Placement:
    """Assigns job queues to worker nodes and takes them back."""

    def __init__(self, queues: JobQueues, records: JobRecords, nodes: NodeRegistry) -> None:
        self._queues = queues
        self._store = records
        self.nodes = nodes

    # -- nodes (jobs/nodes/registry.py owns them; placement reads them) -------------------------------
    def live_nodes(self, now: float, heartbeats: Heartbeats | None = None) -> dict[str, list[str]]:
        """Live node name -> hardware queues it consumes (`NodeRegistry.live`)."""
        return self.nodes.live(now, heartbeats)

    def _give_back_dead(self, now: float, heartbeats: Heartbeats) -> None:
        """Give back the batches of nodes silent for `GIVE_BACK_AFTER_TTLS` node TTLs (or gone from the registry).

        Longer than "lost" for placement: a node whose predictor holds the GIL (a C call that
        never releases it) misses heartbeats while alive, and giving its batch back would run it twice.
        """
        for node in self.nodes.inflight_nodes():
            if silent_too_long(node, now, heartbeats, self.nodes.node_ttl_s):
                try:
                    give_back(node, self.nodes, self._store, self._queues)
                except BAD_RECORD_ERRORS:  # one node's bad entry must not keep the others' batches from going back
                    log.exception("giving back the batches of node %s failed; skipping it in this step", node)

    def held_by_ended_jobs(self, nodes: list[str]) -> set[str]:
        """Those of `nodes` still running a batch of a job that has ended (stopped, timed out, ...).

        Such a node is hung, or about to be ended by its watchdog and restarted: a job placed on it
        would wait for that. Read from the nodes' in-flight hashes.
        """
        held = jobs_held(self.nodes, nodes)
        job_ids = sorted(set().union(*held.values()))
        if not job_ids:
            return set()
        statuses = self._store.statuses(job_ids)
        return {node for node, jobs in held.items() if any(statuses.get(j) not in ACTIVE_STATUSES for j in jobs)}

    # -- assignment -------------------------------------------------------------------------
    def _choose(
        self, job: Job, current: list[str], live: dict[str, list[str]], load: Counter[str],
        held: Set[str] = frozenset(),
    ) -> list[str]:
        """The job keeps its live nodes, and gets the least loaded free ones up to `workers`."""
        kept = [n for n in current if job.hardware_queue in live.get(n, ())]
        eligible = [
            n for n, queues in live.items() if job.hardware_queue in queues and n not in kept and n not in held
        ]
        eligible.sort(key=lambda n: (load[n], n))
        return kept + eligible[: max(job.workers - len(kept), 0)]

    def load(self) -> Counter[str]:
        return self._load()

    def _load(self, exclude: str | None = None) -> Counter[str]:
        load: Counter[str] = Counter()
        for job_id in self._store.active_ids():
            if job_id == exclude:
                continue
            try:
                load.update(self._store.state(job_id).nodes)
            except JobNotFound:  # a record expired between the two reads
                continue
            except BAD_RECORD_ERRORS:  # an unreadable record: reconcile logs it
                continue
        return load

    def assign(self, job: Job, now: float) -> list[str]:
        """Give a new job its nodes (least loaded first) and tell them to consume its queue."""
        live = self.live_nodes(now)
        nodes = self._choose(job, [], live, self._load(exclude=job.job_id), self.held_by_ended_jobs(list(live)))
        self._store.set_nodes(job.job_id, nodes)
        self._add_consumers(job, nodes)
        if not nodes:
            log.warning("no live worker serves queue %s yet; job %s waits for one", job.hardware_queue, job.job_id)
        return nodes

    def reconcile(self, now: float) -> None:
        """One step of the placement loop: give back dead nodes' batches, replace lost nodes, fill
        missing ones, re-send consumers."""
        heartbeats = self.nodes.heartbeats()
        self._give_back_dead(now, heartbeats)
        live = self.live_nodes(now, heartbeats)
        load = self._load()
        held = self.held_by_ended_jobs(list(live))
        for job_id in self._store.active_ids():
            try:
                self._reconcile_job(job_id, live, load, held)
            except BAD_RECORD_ERRORS:  # one bad record must not keep every other job from its nodes; Redis
                # failing is not caught: the whole step is tried again next time
                log.exception("placing job %s failed; skipping it in this step", job_id)

    def _reconcile_job(
        self, job_id: str, live: dict[str, list[str]], load: Counter[str], held: Set[str]
    ) -> None:
        try:
            state = self._store.state(job_id)
        except JobNotFound:  # ended and expired since it was listed
            return
        job = state.job
        if state.status is JobStatus.ENQUEUING and job.source == "delimited_files":
            return  # its input is still being validated: nothing of it may run yet
        nodes = self._choose(job, state.nodes, live, load, held)
        if nodes != state.nodes:
            log.info("job %s moves from nodes %s to %s", job_id, state.nodes, nodes)
            load.subtract(state.nodes)
            load.update(nodes)
            self._store.set_nodes(job_id, nodes)
            lost = [n for n in state.nodes if n not in nodes]
            if lost:
                self._cancel_consumers(job, lost)
        self._add_consumers(job, nodes)

    def assigned_queues(self, node: str) -> list[str]:
        """Queues of the active jobs placed on `node`, which it consumes as soon as it (re)starts.

        The `add_consumer` commands sent while a node was down (restarting after its watchdog ended
        a hung batch, say) reached nobody; beat's reconcile would send them again, but only up to a
        beat interval later.
        """
        queues = []
        for job_id in self._store.active_ids():
            try:
                state = self._store.state(job_id)
            except JobNotFound:
                continue
            except BAD_RECORD_ERRORS:  # an unreadable record: reconcile logs it
                continue
            if node in state.nodes and state.status in ACTIVE_STATUSES:
                queues.append(state.job.queue)
        return queues

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        """A job has ended: its nodes stop consuming its queue and anything left in it is dropped."""
        if nodes is None:
            try:
                nodes = self._store.state(job.job_id).nodes
            except JobNotFound:  # expired already: no node to tell
                nodes = []
        self._cancel_consumers(job, nodes)
        self.drop_queue(job.queue)

    def drop_queue(self, queue: str) -> None:
        """Delete a job queue with every message still in it (`jobs/transport/queues.py`)."""
        self._queues.drop(queue)

    # -- control broadcasts -----------------------------------------------------------------
    def _broadcast(self, send: Callable[[str, list[str]], None], job: Job, nodes: list[str]) -> None:
        if not nodes:
            return
        try:
            send(job.queue, nodes)
        except (KombuError, redis.RedisError, OSError):  # a broker hiccup: the next reconcile step sends it again
            log.exception("control command for job %s failed", job.job_id)

    def _add_consumers(self, job: Job, nodes: list[str]) -> None:
        self._broadcast(self._queues.add_consumers, job, nodes)

    def _cancel_consumers(self, job: Job, nodes: list[str]) -> None:
        self._broadcast(self._queues.cancel_consumers, job, nodes)
