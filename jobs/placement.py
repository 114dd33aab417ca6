"""Placement: which worker nodes serve which job, so that `workers` means what it did in Cortex.

Each job's batches travel on a queue of their own (`job.<id>`). A worker node is one
predictor process (the app runs with `worker_concurrency = 1`); the job runs on at most
`workers` nodes because only that many are told to consume its queue (Celery's
`add_consumer`). Nodes announce themselves with a heartbeat in Redis; a reconcile step,
run in beat's own process (never on a node, whose predictor may hang), moves a lost node's share
to a live one and re-sends the consumer commands, which are idempotent, so a missed broadcast
heals itself. A node still running a batch of a job that has ended (a hung predictor, until its
watchdog ends the process: `jobs/time_limit.py`) is not chosen for another job.

A node runs its batches in its own process (Celery's solo pool), so a node killed mid-batch
(out of memory, SIGKILL) takes its unacknowledged message with it until Redis's visibility
timeout, which is as long as the longest batch allowed. Each node therefore keeps the task ids
of the batches it runs in an in-flight hash (written by the same Lua calls that begin and
record a batch), and `give_back` puts a dead node's batches back at the head of their queues:
a restarted node does it first thing for its previous life, and beat does it for a node silent
for `GIVE_BACK_AFTER_TTLS` node TTLs (one that never comes back). A node that was only slow runs its batch to the end too; the job store
counts the batch once.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import AbstractSet, Any, Callable

import redis
from celery import Celery

from predictors_runtime.errors import JobNotFound

from .job import ACTIVE_STATUSES, Job, JobStatus, job_queue_name
from .settings import Settings
from .store import JobStore

log = logging.getLogger(__name__)

NODES_KEY = "sluice:nodes"
GIVE_BACK_AFTER_TTLS = 4


def is_job_queue(name: str) -> bool:
    return name.startswith("job.")


def write_heartbeat(client: redis.Redis, node: str, queues: list[str], now: float) -> None:
    """Record that `node` is alive and which hardware queues it serves."""
    record = {"queues": sorted(q for q in queues if not is_job_queue(q)), "seen": now}
    client.hset(NODES_KEY, node, json.dumps(record))


def install_resume_on_start(app: Celery, settings: Settings) -> None:
    """A node starting (or restarting under the same name) consumes its jobs' queues from the start."""
    from celery import signals

    @signals.celeryd_after_setup.connect(weak=False)
    def _consume_assigned_queues(sender: str, instance: Any, **_: object) -> None:
        if instance.app is not app:
            return
        from .services import Services

        try:
            queues = Services.connect(settings, app).placement.assigned_queues(sender)
        except redis.RedisError as e:  # beat's reconcile sends them again
            log.warning("reading the jobs placed on %s failed: %s", sender, e)
            return
        for queue in queues:
            app.amqp.queues.select_add(queue, exchange=queue, exchange_type="direct", routing_key=queue)
        if queues:
            log.info("node %s resumes the jobs placed on it: %s", sender, queues)


def _unacked_tags_of(channel: Any, task_ids: set[str]) -> list[str]:
    """kombu's delivery tags of the unacknowledged messages carrying these Celery tasks.

    kombu's Redis transport keeps each unacknowledged message in a hash (tag -> JSON of the
    message, exchange and routing key) until it is acknowledged; Celery does not tell a task its
    tag, so the messages are found by the task id in their headers. The hash holds one entry per
    batch running anywhere, so it stays small.
    """
    tags = []
    with channel.conn_or_acquire() as client:
        unacked = client.hgetall(channel.unacked_key)
    for tag, raw in unacked.items():
        try:
            message = json.loads(raw)[0]
        except (ValueError, IndexError, TypeError):
            continue
        if (message.get("headers") or {}).get("id") in task_ids:
            tags.append(tag.decode() if isinstance(tag, bytes) else tag)
    return tags


class Placement:
    """Assigns job queues to worker nodes and takes them back."""

    def __init__(
        self, celery: Celery, store: JobStore, client: redis.Redis, node_ttl_s: float
    ) -> None:
        self._celery = celery
        self._store = store
        self._redis = client
        self._node_ttl_s = node_ttl_s

    # -- node registry ----------------------------------------------------------------------
    def heartbeat(self, node: str, queues: list[str], now: float) -> None:
        write_heartbeat(self._redis, node, queues, now)

    def forget_node(self, node: str) -> None:
        self._redis.hdel(NODES_KEY, node)

    def give_back(self, node: str) -> int:
        """Put the batches a dead `node` held back at the head of their job queues; returns how many.

        Batches of jobs that have ended are dropped with their queue instead.
        """
        entries = self._store.inflight(node)
        if not entries:
            return 0
        job_ids = {entry.rsplit(":", 1)[0] for entry in entries.values()}
        statuses = self._store.statuses(sorted(job_ids))
        with self._celery.connection_for_write() as conn:
            channel = conn.default_channel
            for tag in _unacked_tags_of(channel, set(entries)):
                channel.qos.restore_by_tag(tag)  # to the end BRPOP takes next; a no-op if acknowledged meanwhile
        for job_id in job_ids:
            if statuses.get(job_id) not in ACTIVE_STATUSES:
                self.drop_queue(job_queue_name(job_id))
        self._store.forget_inflight(node, entries)
        log.warning("gave back %d batch(es) held by node %s: %s", len(entries), node, sorted(entries.values()))
        return len(entries)

    def _heartbeats(self) -> dict[str, dict[str, Any]]:
        """Node name -> {queues, seen}; an unreadable record is logged and left out, not fatal to the rest."""
        heartbeats = {}
        for raw_name, raw in self._redis.hgetall(NODES_KEY).items():
            name = raw_name.decode(errors="replace")
            try:
                record = json.loads(raw)
                heartbeats[name] = {"queues": [str(q) for q in record["queues"]], "seen": float(record["seen"])}
            except (ValueError, TypeError, KeyError) as e:
                log.warning("ignoring the unreadable heartbeat of node %s: %r", name, e)
        return heartbeats

    def live_nodes(self, now: float, heartbeats: dict[str, dict[str, Any]] | None = None) -> dict[str, list[str]]:
        """Live node name -> hardware queues it consumes. Long-dead nodes are dropped from the registry."""
        live: dict[str, list[str]] = {}
        for name, record in (self._heartbeats() if heartbeats is None else heartbeats).items():
            age = now - float(record["seen"])
            if age <= self._node_ttl_s:
                live[name] = record["queues"]
            elif age > 20 * self._node_ttl_s:
                self._redis.hdel(NODES_KEY, name)
        return live

    def _give_back_dead(self, now: float, heartbeats: dict[str, dict[str, Any]]) -> None:
        """Give back the batches of nodes silent for GIVE_BACK_AFTER_TTLS node TTLs (or gone from the registry).

        Longer than "lost" for placement: a node whose predictor holds the GIL (a C call that
        never releases it) misses heartbeats while alive, and giving its batch back would run it twice.
        """
        for node in self._store.inflight_nodes():
            record = heartbeats.get(node)
            if record is None or now - float(record["seen"]) > GIVE_BACK_AFTER_TTLS * self._node_ttl_s:
                try:
                    self.give_back(node)
                except redis.RedisError:
                    raise
                except Exception:  # one node's bad entry must not keep the others' batches from going back
                    log.exception("giving back the batches of node %s failed; skipping it in this step", node)

    def held_by_ended_jobs(self, nodes: list[str]) -> set[str]:
        """Those of `nodes` still running a batch of a job that has ended (stopped, timed out, ...).

        Such a node is hung, or about to be ended by its watchdog and restarted: a job placed on it
        would wait for that. Read from the nodes' in-flight hashes.
        """
        held = {node: {entry.rsplit(":", 1)[0] for entry in self._store.inflight(node).values()} for node in nodes}
        job_ids = sorted(set().union(*held.values()))
        if not job_ids:
            return set()
        statuses = self._store.statuses(job_ids)
        return {node for node, jobs in held.items() if any(statuses.get(j) not in ACTIVE_STATUSES for j in jobs)}

    # -- assignment -------------------------------------------------------------------------
    def _choose(
        self, job: Job, current: list[str], live: dict[str, list[str]], load: Counter[str],
        held: AbstractSet[str] = frozenset(),
    ) -> list[str]:
        """The job keeps its live nodes, and gets the least loaded free ones up to `workers`."""
        kept = [n for n in current if job.hardware_queue in live.get(n, ())]
        eligible = [
            n for n, queues in live.items() if job.hardware_queue in queues and n not in kept and n not in held
        ]
        eligible.sort(key=lambda n: (load[n], n))
        return kept + eligible[: max(job.workers - len(kept), 0)]

    def _load(self, exclude: str | None = None) -> Counter[str]:
        load: Counter[str] = Counter()
        for job_id in self._store.active_ids():
            if job_id == exclude:
                continue
            try:
                load.update(self._store.state(job_id).nodes)
            except Exception:  # a record expired between the two reads
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
        heartbeats = self._heartbeats()
        self._give_back_dead(now, heartbeats)
        live = self.live_nodes(now, heartbeats)
        load = self._load()
        held = self.held_by_ended_jobs(list(live))
        for job_id in self._store.active_ids():
            try:
                self._reconcile_job(job_id, live, load, held)
            except redis.RedisError:
                raise  # Redis itself failed: the whole step is tried again next time
            except Exception:  # one bad record must not keep every other job from its nodes
                log.exception("placing job %s failed; skipping it in this step", job_id)

    def _reconcile_job(
        self, job_id: str, live: dict[str, list[str]], load: Counter[str], held: AbstractSet[str]
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
            except (ValueError, TypeError, KeyError):  # an unreadable record: reconcile logs it
                continue
            if node in state.nodes and state.status in ACTIVE_STATUSES:
                queues.append(state.job.queue)
        return queues

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        """A job has ended: its nodes stop consuming its queue and anything left in it is dropped."""
        if nodes is None:
            try:
                nodes = self._store.state(job.job_id).nodes
            except Exception:
                nodes = []
        self._cancel_consumers(job, nodes)
        self.drop_queue(job.queue)

    def drop_queue(self, queue: str) -> None:
        """Delete a job queue with every message still in it (kombu handles priority sub-queues)."""
        with self._celery.connection_for_write() as conn:
            channel = conn.default_channel
            channel.queue_purge(queue)
            channel.queue_delete(queue)

    # -- control broadcasts -----------------------------------------------------------------
    def _broadcast(self, send: Callable[..., object], job: Job, nodes: list[str]) -> None:
        if not nodes:
            return
        try:
            send(job.queue, destination=nodes, reply=False)
        except Exception:  # a broker hiccup: the next reconcile step sends it again
            log.exception("control command for job %s failed", job.job_id)

    def _add_consumers(self, job: Job, nodes: list[str]) -> None:
        self._broadcast(self._celery.control.add_consumer, job, nodes)

    def _cancel_consumers(self, job: Job, nodes: list[str]) -> None:
        self._broadcast(self._celery.control.cancel_consumer, job, nodes)
