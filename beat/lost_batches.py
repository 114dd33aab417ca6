"""Beat's net under the broker: a batch whose message was lost, or left orphaned, is sent again.

kombu's Redis transport takes a message off its queue with BRPOP and only then records it in its
unacknowledged hash (a batch run as soon as it is taken: its begin records it, with its in-flight
entry, `jobs/transport/broker.py`); a node killed in between (more likely than it sounds: the
moment Redis comes back from a stall, every idle node is handed a message at once) takes the
message along, and nothing would ever run that batch. A message recorded but not entered in an
in-flight hash (`BatchLedger.begin_batch`; one a node took ahead of its run) is left in the
unacknowledged hash with nothing to give it back (`jobs/transport/settle.py` works from in-flight
hashes) until Redis's visibility timeout, an hour by default. Either way the job waits.

So for each running job whose batches are all published, beat looks for its batches everywhere
a batch can be, in the order a batch travels (its queue, the unacknowledged hash, the nodes'
in-flight hashes, then the recorded set, read last so that a batch moving on during the look is
still seen): when nothing of the job is queued or in flight, and some batches are recorded
nowhere, or sit unacknowledged with no node running them, and the look finds the very same for
`grace_s` (no batch recorded meanwhile), the orphaned messages are given back to the job's queue
and the lost batches are published again from the copy the publisher kept
(`BatchLedger.keep_payloads`). A lost batch without a copy is recorded as failed, saying so, so the
job completes instead of hanging. The store counts every batch once, so a batch sent again that
turns out not to have been lost after all costs a run, never a double count.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any

from foundation.redis_clients import text
from foundation.settings import Settings
from jobs.batch.job import JobStatus, job_queue_name
from jobs.batch.publish import BatchPublisher, send_completion
from jobs.nodes.registry import is_request_entry, parse_inflight_entry
from jobs.services import Services
from jobs.store import JobState, Recorded
from jobs.tasks import RUN_BATCH
from jobs.transport.broker import queue_lengths

from .steps import judge_each

log = logging.getLogger(__name__)

# Shortest time the same batches must be seen missing before beat acts.
LOST_GRACE_S = 10.0
LOST_MESSAGE = ("the broker lost this batch's message (a worker node died while taking it) and no copy "
                "of its payload was kept to send it again")


def lost_grace_s(settings: Settings) -> float:
    """Three beat intervals at least: one look can miss a batch only while a node is taking it."""
    return max(LOST_GRACE_S, 3 * settings.beat_interval_s)


@dataclass(frozen=True)
class Unacked:
    """A batch message in kombu's unacknowledged hash."""

    tag: str
    task_id: str
    index: int


def _run_batch_args(raw: bytes) -> tuple[str, list[Any]] | None:
    """(task id, args) of a `run_batch` message as kombu keeps it unacknowledged; None for any other."""
    try:
        message = json.loads(raw)[0]
        headers = message.get("headers") or {}
        if headers.get("task") != RUN_BATCH:
            return None
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(headers["id"]), list(args)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


class LostBatchWatch:
    """The step, with what the last looks found for each job (beat runs one of these, in its process)."""

    def __init__(self, grace_s: float = LOST_GRACE_S) -> None:
        self.grace_s = grace_s
        # job id -> (what was missing, when first seen so)
        self._seen: dict[str, tuple[tuple[Any, ...], float]] = {}

    def __call__(self, services: Services, now: float) -> list[str]:
        """Give back orphaned messages and publish lost batches again; returns the ids of the jobs helped."""
        store = services.store
        job_ids = store.active_ids()
        queued = self._queued(services, job_ids)
        unacked = self._unacked(services)
        inflight = self._inflight_jobs(services)
        self._seen = {job_id: seen for job_id, seen in self._seen.items() if job_id in job_ids}

        def judge(state: JobState) -> bool:
            job_id = state.job.job_id
            total = state.sealed_total
            if (job_id not in queued or state.status is not JobStatus.RUNNING or total is None
                    or queued[job_id] or job_id in inflight):
                self._seen.pop(job_id, None)
                return False
            done = store.recorded_indexes(job_id)  # read last: a batch that moved on meanwhile is seen here
            orphans = sorted((u for u in unacked.get(job_id, []) if u.index not in done), key=lambda u: u.index)
            held = {u.index for u in unacked.get(job_id, [])}
            lost = [index for index in range(total) if index not in done and index not in held]
            if not lost and not orphans:
                self._seen.pop(job_id, None)
                return False
            finding = (len(done), tuple(lost), tuple(u.task_id for u in orphans))
            previous = self._seen.get(job_id)
            if previous is None or previous[0] != finding:
                self._seen[job_id] = (finding, now)
                return False
            if now - previous[1] < self.grace_s:
                return False
            del self._seen[job_id]
            self._recover(services, state, orphans, lost, now - previous[1])
            return True

        return judge_each(store, "recover_lost_batches", judge)

    @staticmethod
    def _queued(services: Services, job_ids: list[str]) -> dict[str, int]:
        """Messages waiting in each job's queue (every priority level of it)."""
        with services.celery.connection_for_write() as conn:
            lengths = queue_lengths(conn.default_channel, [job_queue_name(job_id) for job_id in job_ids])
        return {job_id: lengths[job_queue_name(job_id)] for job_id in job_ids}

    @staticmethod
    def _unacked(services: Services) -> dict[str, list[Unacked]]:
        """Job id -> its batch messages in kombu's unacknowledged hash (one per batch being taken or run)."""
        with services.celery.connection_for_write() as conn:
            channel = conn.default_channel
            with channel.conn_or_acquire() as client:
                raw = client.hgetall(channel.unacked_key)
        found: dict[str, list[Unacked]] = {}
        for tag, value in raw.items():
            parsed = _run_batch_args(value)
            if parsed is None:
                continue
            task_id, args = parsed
            try:
                job_id, index = str(args[0]), int(args[1])
            except (IndexError, TypeError, ValueError):
                continue
            tag = text(tag)
            found.setdefault(job_id, []).append(Unacked(tag=tag, task_id=task_id, index=index))
        return found

    @staticmethod
    def _inflight_jobs(services: Services) -> set[str]:
        """Jobs with anything in some node's in-flight hash (live nodes, and dead ones not yet given back)."""
        jobs: set[str] = set()
        for node in services.nodes.inflight_nodes():
            for entry in services.nodes.inflight(node).values():
                if not is_request_entry(entry):
                    jobs.add(parse_inflight_entry(entry)[0])
        return jobs

    @staticmethod
    def _recover(services: Services, state: JobState, orphans: list[Unacked], lost: list[int], for_s: float) -> None:
        store, job = services.store, state.job
        if orphans:
            with services.celery.connection_for_write() as conn:
                channel = conn.default_channel
                for orphan in orphans:
                    channel.qos.restore_by_tag(orphan.tag)  # a no-op if it was acknowledged meanwhile
            log.warning("job %s: gave back %d batch(es) left unacknowledged by no node for %.0fs: %s",
                        job.job_id, len(orphans), for_s, [o.index for o in orphans])
        if not lost:
            return
        kept = store.kept_payloads(job.job_id, lost)
        if kept:
            with BatchPublisher(services.celery, job.job_id, job.queue) as publisher:
                for index in sorted(kept):
                    payload, ref = kept[index]
                    publisher.batch(index, payload, ref)
            log.warning("job %s: batches %s were in no queue, on no node and not recorded for %.0fs "
                        "(the broker lost their messages); published them again", job.job_id, sorted(kept), for_s)
        for index in (i for i in lost if i not in kept):
            log.error("job %s batch %d: %s", job.job_id, index, LOST_MESSAGE)
            if store.record_failure(job.job_id, index, 0.0, LOST_MESSAGE, 0, None) is Recorded.COMPLETED_JOB:
                send_completion(services.celery, job.job_id, job.queue)
