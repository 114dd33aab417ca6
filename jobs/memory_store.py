"""An in-memory job store, for fast tests of what sits on top of the store (enqueueing, the API).

It keeps the contract of the Redis store (`jobs/store.py`) that `tests/unit/test_store_contract.py`
checks against both: batch outcomes counted once, terminal statuses never overwritten, exactly
one caller told that a job completed, a repeat of a call (same token) answered as its first run
was. What it leaves out is what only Redis has: expiry of ended jobs, and other processes.
Every method takes one lock, so an enqueuing thread and a request thread may share it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from foundation.errors import JobNotFound

from . import store as _redis_store  # its `new_token`, looked up per call (tests pin it)
from .job import ACTIVE_STATUSES, Job, JobStatus
from .nodes import Delivery, inflight_entry
from .store import BatchStart, Claim, JobState, Recorded


@dataclass
class _Entry:
    """One job as the Redis store's hash and its companion keys hold it."""

    record: str  # the job's JSON, as stored
    status: JobStatus
    start_time: float
    succeeded: int = 0
    failed: int = 0
    time_total: float = 0.0
    nodes: list[str] = field(default_factory=list)
    end_time: float | None = None
    message: str = ""
    moved_by: str | None = None
    enqueue_seen: float | None = None
    sealed_total: int | None = None
    finishing: str | None = None
    finishing_at: float | None = None
    completing: str | None = None
    hook_done: str | None = None
    completion_resent_at: float | None = None
    done: set[int] = field(default_factory=set)
    failures: dict[int, str] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    starts_by: dict[int, str] = field(default_factory=dict)
    parts: dict[int, int] = field(default_factory=dict)
    payloads: dict[int, str] = field(default_factory=dict)


def _not_found(job_id: str, api_name: str | None) -> JobNotFound:
    return JobNotFound(f"job {job_id} not found" + (f" for api {api_name}" if api_name else ""))


class MemoryJobStore:
    """`JobStore`'s contract kept in a dict. `inflight` stands in for the nodes' in-flight hashes
    the Redis store's scripts write (node -> task id -> entry)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._jobs: dict[str, _Entry] = {}
        self.inflight: dict[str, dict[str, str]] = {}

    def _entry(self, job_id: str, api_name: str | None = None) -> _Entry:
        entry = self._jobs.get(job_id)
        if entry is None:
            raise _not_found(job_id, api_name)
        return entry

    def _each(self, job_id: str) -> list[_Entry]:
        """The job's entry in a list of one, or none: a write to a job that is gone does nothing."""
        entry = self._jobs.get(job_id)
        return [entry] if entry is not None else []

    def _job(self, entry: _Entry, job_id: str, api_name: str | None) -> Job:
        job = Job.from_dict(json.loads(entry.record))
        if api_name is not None and job.api_name != api_name:
            raise JobNotFound(f"job {job_id} not found for api {api_name}")
        return job

    # -- jobs -------------------------------------------------------------------------------
    def create(self, job: Job, status: JobStatus = JobStatus.ENQUEUING) -> None:
        with self._lock:
            self._jobs[job.job_id] = _Entry(
                record=json.dumps(job.to_dict()), status=status, start_time=job.start_time,
                enqueue_seen=job.start_time,
            )

    def get(self, job_id: str, api_name: str | None = None) -> Job:
        with self._lock:
            return self._job(self._entry(job_id, api_name), job_id, api_name)

    def state(self, job_id: str, api_name: str | None = None) -> JobState:
        with self._lock:
            e = self._entry(job_id, api_name)
            return JobState(
                job=self._job(e, job_id, api_name), status=e.status, succeeded=e.succeeded, failed=e.failed,
                time_total=e.time_total, end_time=e.end_time, message=e.message, nodes=list(e.nodes),
                finishing_at=e.finishing_at, completion_claimed=e.completing is not None,
                hook_message=e.hook_done, completion_resent_at=e.completion_resent_at, sealed_total=e.sealed_total,
            )

    def status(self, job_id: str) -> JobStatus | None:
        with self._lock:
            entry = self._jobs.get(job_id)
            return entry.status if entry is not None else None

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]:
        with self._lock:
            return {job_id: self.status(job_id) for job_id in job_ids}

    def list_ids(self, api_name: str, limit: int = 100) -> list[str]:
        """Job ids of an API, newest first."""
        with self._lock:
            mine = [(e.start_time, job_id) for job_id, e in self._jobs.items()
                    if json.loads(e.record)["api_name"] == api_name]
            return [job_id for _, job_id in sorted(mine, reverse=True)][:limit]

    def active_ids(self) -> list[str]:
        with self._lock:
            return sorted(job_id for job_id, e in self._jobs.items() if e.status in ACTIVE_STATUSES)

    def transition(
        self, job_id: str, new_status: JobStatus, allowed_from: Iterable[JobStatus] = ACTIVE_STATUSES,
        message: str = "", now: float | None = None,
    ) -> bool:
        token = _redis_store.new_token()
        with self._lock:
            e = self._jobs.get(job_id)
            if e is None:
                return False
            if e.status is new_status and e.moved_by == token:
                return True
            if e.status not in set(allowed_from):
                return False
            e.status, e.moved_by = new_status, token
            if new_status.is_terminal:
                e.end_time = time.time() if now is None else now
            if message:
                e.message = message
            return True

    def touch_enqueue(self, job_id: str, now: float) -> None:
        with self._lock:
            for entry in self._each(job_id):
                entry.enqueue_seen = now

    def enqueue_seen(self, job_id: str) -> float | None:
        with self._lock:
            entry = self._jobs.get(job_id)
            return entry.enqueue_seen if entry is not None else None

    def update_record(self, job: Job) -> None:
        with self._lock:
            for entry in self._each(job.job_id):
                entry.record = json.dumps(job.to_dict())

    def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        with self._lock:
            for entry in self._each(job_id):
                entry.nodes = list(nodes)

    def claim_completion(self, job_id: str, token: str, task_id: str = "") -> Claim:
        with self._lock:
            e = self._jobs.get(job_id)
            if e is None:
                return Claim.GONE
            if e.completing is None:
                e.completing = token
                return Claim.CLAIMED
            if e.hook_done is not None:
                return Claim.RAN
            if e.completing == token:
                return Claim.CLAIMED
            if task_id and e.completing.startswith(task_id + "/"):
                return Claim.DIED
            return Claim.BUSY

    def mark_hook_done(self, job_id: str, message: str = "") -> None:
        with self._lock:
            for entry in self._each(job_id):
                entry.hook_done = message

    def mark_completion_resent(self, job_id: str, now: float) -> None:
        with self._lock:
            for entry in self._each(job_id):
                entry.completion_resent_at = now

    # -- batches ----------------------------------------------------------------------------
    def begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> BatchStart:
        token = _redis_store.new_token()
        with self._lock:
            e = self._jobs.get(job_id)
            if e is None:
                return BatchStart(status=None, already_recorded=False, deliveries=0)
            done = index in e.done
            starts = 0
            if e.status in ACTIVE_STATUSES:
                if e.starts_by.get(index) == token:
                    starts = e.starts[index]
                else:
                    starts = e.starts[index] = e.starts.get(index, 0) + 1
                    e.starts_by[index] = token
            if starts > 0 and not done and delivery is not None:
                self.inflight.setdefault(delivery.node, {})[delivery.task_id] = inflight_entry(job_id, index)
            return BatchStart(status=e.status, already_recorded=done, deliveries=starts)

    def _finish_if_all_recorded(self, e: _Entry, token: str, now: float) -> bool:
        if e.sealed_total is None or len(e.done) < e.sealed_total:
            return False
        if e.finishing is None:
            e.finishing, e.finishing_at = token, now
            return True
        return e.finishing == token

    def seal(self, job_id: str, total_batch_count: int, now: float | None = None) -> bool:
        token = _redis_store.new_token()
        with self._lock:
            e = self._jobs.get(job_id)
            if e is None:
                return False
            e.sealed_total = total_batch_count
            return self._finish_if_all_recorded(e, token, time.time() if now is None else now)

    def _record(
        self, job_id: str, index: int, ok: bool, seconds: float, failure: str, delivery: Delivery | None
    ) -> Recorded:
        token = _redis_store.new_token()
        with self._lock:
            if delivery is not None:
                self.inflight.get(delivery.node, {}).pop(delivery.task_id, None)
            e = self._jobs.get(job_id)
            if e is None:
                return Recorded.DUPLICATE
            if index in e.done:
                return Recorded.COMPLETED_JOB if e.finishing == token else Recorded.DUPLICATE
            e.done.add(index)
            e.payloads.pop(index, None)
            if ok:
                e.succeeded += 1
            else:
                e.failed += 1
                e.failures[index] = failure
            e.time_total += seconds
            if e.finishing is None and self._finish_if_all_recorded(e, token, time.time()):
                return Recorded.COMPLETED_JOB
            return Recorded.COUNTED

    def record_success(self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None) -> Recorded:
        return self._record(job_id, index, True, seconds, "", delivery)

    def record_failure(
        self, job_id: str, index: int, seconds: float, error: str, tries: int, payload: Any,
        payload_ref: dict[str, Any] | None = None, delivery: Delivery | None = None,
    ) -> Recorded:
        record = _redis_store.failed_batch_record(index, error, tries, payload, payload_ref)
        return self._record(job_id, index, False, seconds, record, delivery)

    def recorded_indexes(self, job_id: str) -> set[int]:
        with self._lock:
            entry = self._jobs.get(job_id)
            return set(entry.done) if entry is not None else set()

    def recorded(self, job_id: str, indexes: Iterable[int]) -> dict[int, bool]:
        done = self.recorded_indexes(job_id)
        return {index: index in done for index in indexes}

    def keep_payloads(self, job_id: str, payloads: dict[int, tuple[Any, dict[str, Any] | None]]) -> None:
        with self._lock:
            entry = self._jobs.get(job_id)
            if entry is not None:
                entry.payloads.update({index: json.dumps(list(batch)) for index, batch in payloads.items()})

    def kept_payloads(self, job_id: str, indexes: Iterable[int]) -> dict[int, tuple[Any, dict[str, Any] | None]]:
        with self._lock:
            entry = self._jobs.get(job_id)
            kept = {}
            for index in indexes:
                raw = entry.payloads.get(index) if entry is not None else None
                if raw is not None:
                    payload, ref = json.loads(raw)
                    kept[index] = (payload, ref)
            return kept

    def record_part(self, job_id: str, index: int, rows: int) -> None:
        with self._lock:
            for entry in self._each(job_id):
                entry.parts[index] = int(rows)

    def parts(self, job_id: str) -> dict[int, int]:
        with self._lock:
            entry = self._jobs.get(job_id)
            return dict(entry.parts) if entry is not None else {}

    def failed_batches(self, job_id: str) -> list[dict[str, Any]]:
        with self._lock:
            entry = self._jobs.get(job_id)
            failures = list(entry.failures.values()) if entry is not None else []
        return sorted((json.loads(raw) for raw in failures), key=lambda f: f["index"])
