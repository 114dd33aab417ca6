"""The job store in memory, for fast tests of what sits on top of it (the batch path, enqueueing, the API).

It keeps the contract of the Redis store that `tests/unit/test_store_contract.py` checks (and
`tests/integration/test_store_redis.py` against both): batch outcomes counted once, terminal
statuses never overwritten, exactly one caller told that a job completed, a repeat of a call (same
token) answered as its first run was. A job's hash is a dict of the same fields (`schema.JobField`),
read back through the same `schema.job_state`. What it leaves out is what only Redis has: expiry of
ended jobs, the figure of ended jobs, and other processes. Every call takes one lock, so an
enqueuing thread and a request thread may share it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from jobs.batch.job import ACTIVE_STATUSES, Job, JobStatus
from jobs.store import values
from jobs.store.answers import Answer, Answered
from jobs.store.schema import JobField, job_state, new_job_hash
from jobs.store.values import BatchStart, Claim, JobState, Payload, Recorded, failed_batch_record, not_found
from jobs.transport.delivery import Delivery, inflight_entry


@dataclass
class _Job:
    """One job's keys: its hash and the companion keys Redis keeps beside it."""

    fields: dict[str, str]
    done: set[int] = field(default_factory=set)
    failed: dict[int, str] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    starts_by: dict[int, str] = field(default_factory=dict)
    parts: dict[int, int] = field(default_factory=dict)
    payloads: dict[int, str] = field(default_factory=dict)
    timed_out: dict[int, int] = field(default_factory=dict)


class MemoryJobTable:
    """Every job's keys, shared by the three parts of one in-memory store; `inflight` stands in for
    the nodes' in-flight hashes (node -> task id -> entry) that the ledger shares with `MemoryNodes`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.jobs: dict[str, _Job] = {}
        self.api_jobs: dict[str, dict[str, float]] = {}
        self.active: set[str] = set()
        self.inflight: dict[str, dict[str, str]] = {}


class _Part:
    def __init__(self, table: MemoryJobTable | None = None) -> None:
        self._table = table if table is not None else MemoryJobTable()

    def _recorded_job(self, job_id: str) -> _Job | None:
        """The job's keys if its hash holds its record: what the Redis scripts check before they write."""
        entry = self._table.jobs.get(job_id)
        return entry if entry is not None and JobField.RECORD in entry.fields else None

    @property
    def inflight(self) -> dict[str, dict[str, str]]:
        """The nodes' in-flight hashes this store writes (hand them to `MemoryNodes`)."""
        return self._table.inflight


class MemoryJobRecords(_Part):
    """`JobRecords` in memory."""

    def create(self, job: Job, status: JobStatus = JobStatus.ENQUEUING) -> None:
        with self._table.lock:
            self._table.jobs[job.job_id] = _Job(new_job_hash(job, status))
            self._table.api_jobs.setdefault(job.api_name, {})[job.job_id] = job.start_time
            self._table.active.add(job.job_id)

    def hash_of(self, job_id: str) -> dict[str, str]:
        """The job's hash itself, as Redis would hold it: for a test that damages a record by hand (or
        empties it, as expiry does)."""
        return self._fields(job_id, None)

    def _fields(self, job_id: str, api_name: str | None) -> dict[str, str]:
        entry = self._table.jobs.get(job_id)
        if entry is None or not entry.fields:  # as in Redis, a hash emptied is no hash
            raise not_found(job_id, api_name)
        return entry.fields

    def get(self, job_id: str, api_name: str | None = None) -> Job:
        with self._table.lock:
            job = Job.from_dict(json.loads(self._fields(job_id, api_name)[JobField.RECORD]))
        if api_name is not None and job.api_name != api_name:
            raise not_found(job_id, api_name)
        return job

    def state(self, job_id: str, api_name: str | None = None) -> JobState:
        with self._table.lock:
            state = job_state(dict(self._fields(job_id, api_name)))
        if api_name is not None and state.job.api_name != api_name:
            raise not_found(job_id, api_name)
        return state

    def status(self, job_id: str) -> JobStatus | None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            status = entry.fields.get(JobField.STATUS) if entry is not None else None
            return JobStatus(status) if status is not None else None

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]:
        with self._table.lock:
            return {job_id: self.status(job_id) for job_id in job_ids}

    def list_ids(self, api_name: str, limit: int = 100) -> list[str]:
        with self._table.lock:
            scored = self._table.api_jobs.get(api_name, {})
            return [job_id for _, job_id in sorted(((t, j) for j, t in scored.items()), reverse=True)][:limit]

    def active_ids(self) -> list[str]:
        with self._table.lock:
            return sorted(self._table.active)

    def transition(
        self, job_id: str, new_status: JobStatus, allowed_from: Iterable[JobStatus] = ACTIVE_STATUSES,
        message: str = "", now: float | None = None,
    ) -> bool:
        token = values.new_token()
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is None:
                return False
            fields = entry.fields
            current = fields.get(JobField.STATUS)
            if current is None:
                return False
            if current == new_status.value and fields.get(JobField.MOVED_BY) == token:
                return True
            if current not in {status.value for status in allowed_from}:
                return False
            fields[JobField.STATUS], fields[JobField.MOVED_BY] = new_status.value, token
            if new_status.is_terminal:
                fields[JobField.END_TIME] = repr(time.time() if now is None else now)
                self._table.active.discard(job_id)
            if message:
                fields[JobField.MESSAGE] = message
            return True

    def _set(self, job_id: str, name: JobField, value: str) -> None:
        """Like HSET on the job's hash, except that a job that is gone gains nothing."""
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is not None:
                entry.fields[name] = value

    def touch_enqueue(self, job_id: str, now: float) -> None:
        self._set(job_id, JobField.ENQUEUE_SEEN, repr(now))

    def enqueue_seen(self, job_id: str) -> float | None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            return float(entry.fields[JobField.ENQUEUE_SEEN]) if entry is not None else None

    def update_record(self, job: Job) -> None:
        self._set(job.job_id, JobField.RECORD, json.dumps(job.to_dict()))

    def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        self._set(job_id, JobField.NODES, json.dumps(nodes))

    def note_predictor(self, job_id: str, note: str) -> None:
        self._set(job_id, JobField.PREDICTOR_NOTE, note)


class MemoryBatchLedger(_Part):
    """`BatchLedger` in memory."""

    def send_begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> Answer[BatchStart]:
        return Answered(self.begin_batch(job_id, index, delivery))

    def begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> BatchStart:
        token = values.new_token()
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is None or JobField.STATUS not in entry.fields:
                return BatchStart(status=None, already_recorded=False, deliveries=0)
            status = JobStatus(entry.fields[JobField.STATUS])
            done = index in entry.done
            starts = 0
            if status in ACTIVE_STATUSES:
                if entry.starts_by.get(index) == token:
                    starts = entry.starts[index]
                else:
                    starts = entry.starts[index] = entry.starts.get(index, 0) + 1
                    entry.starts_by[index] = token
            if starts > 0 and not done and delivery is not None:
                self._table.inflight.setdefault(delivery.node, {})[delivery.task_id] = inflight_entry(job_id, index)
            return BatchStart(status=status, already_recorded=done, deliveries=starts,
                              timed_out_tries=entry.timed_out.get(index, 0))

    @staticmethod
    def _finish_if_all_recorded(entry: _Job, token: str, now: float) -> bool:
        sealed = entry.fields.get(JobField.SEALED_TOTAL)
        if sealed is None or len(entry.done) < int(sealed):
            return False
        finishing = entry.fields.get(JobField.FINISHING)
        if finishing is None:
            entry.fields[JobField.FINISHING], entry.fields[JobField.FINISHING_AT] = token, repr(now)
            return True
        return finishing == token

    def seal(self, job_id: str, total_batch_count: int, now: float | None = None) -> bool:
        token = values.new_token()
        with self._table.lock:
            entry = self._recorded_job(job_id)
            if entry is None:
                return False
            entry.fields[JobField.SEALED_TOTAL] = str(total_batch_count)
            return self._finish_if_all_recorded(entry, token, time.time() if now is None else now)

    def _record(
        self, job_id: str, index: int, ok: bool, seconds: float, failure: str, delivery: Delivery | None
    ) -> Recorded:
        token = values.new_token()
        with self._table.lock:
            if delivery is not None:
                self._table.inflight.get(delivery.node, {}).pop(delivery.task_id, None)
            entry = self._recorded_job(job_id)
            if entry is None:
                return Recorded.DUPLICATE
            if index in entry.done:
                return Recorded.COMPLETED_JOB if entry.fields.get(JobField.FINISHING) == token else Recorded.DUPLICATE
            entry.done.add(index)
            entry.payloads.pop(index, None)
            counter = JobField.SUCCEEDED if ok else JobField.FAILED
            entry.fields[counter] = str(int(entry.fields.get(counter, "0")) + 1)
            if not ok:
                entry.failed[index] = failure
            entry.fields[JobField.TIME_TOTAL] = repr(float(entry.fields.get(JobField.TIME_TOTAL, "0")) + seconds)
            if JobField.FINISHING not in entry.fields and self._finish_if_all_recorded(entry, token, time.time()):
                return Recorded.COMPLETED_JOB
            return Recorded.COUNTED

    def record_success(self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None) -> Recorded:
        return self._record(job_id, index, True, seconds, "", delivery)

    def send_record_success(
        self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None
    ) -> Answer[Recorded]:
        return Answered(self.record_success(job_id, index, seconds, delivery))

    def record_failure(
        self, job_id: str, index: int, seconds: float, error: str, tries: int, payload: Any,
        payload_ref: dict[str, Any] | None = None, delivery: Delivery | None = None,
    ) -> Recorded:
        record = failed_batch_record(index, error, tries, payload, payload_ref)
        return self._record(job_id, index, False, seconds, record, delivery)

    def recorded_indexes(self, job_id: str) -> set[int]:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            return set(entry.done) if entry is not None else set()

    def recorded(self, job_id: str, indexes: Iterable[int]) -> dict[int, bool]:
        done = self.recorded_indexes(job_id)
        return {index: index in done for index in indexes}

    def keep_payloads(self, job_id: str, payloads: dict[int, Payload]) -> None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is not None:
                entry.payloads.update({index: json.dumps(list(batch)) for index, batch in payloads.items()})

    def kept_payloads(self, job_id: str, indexes: Iterable[int]) -> dict[int, Payload]:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            kept: dict[int, Payload] = {}
            for index in indexes:
                raw = entry.payloads.get(index) if entry is not None else None
                if raw is not None:
                    payload, ref = json.loads(raw)
                    kept[index] = (payload, ref)
            return kept

    def record_part(self, job_id: str, index: int, rows: int) -> None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is not None:
                entry.parts[index] = int(rows)

    def parts(self, job_id: str) -> dict[int, int]:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            return dict(entry.parts) if entry is not None else {}

    def failed_batches(self, job_id: str) -> list[dict[str, Any]]:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            failures = list(entry.failed.values()) if entry is not None else []
        return sorted((json.loads(raw) for raw in failures), key=lambda f: f["index"])

    def timed_out_tries(self, job_id: str, index: int) -> int:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            return entry.timed_out.get(index, 0) if entry is not None else 0

    def mark_timed_out(self, job_id: str, index: int, tries_used: int) -> None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is not None:
                entry.timed_out[index] = tries_used


class MemoryCompletionClaims(_Part):
    """`CompletionClaims` in memory."""

    def claim_completion(self, job_id: str, token: str, task_id: str = "") -> Claim:
        with self._table.lock:
            entry = self._recorded_job(job_id)
            if entry is None:
                return Claim.GONE
            current = entry.fields.get(JobField.COMPLETING)
            if current is None:
                entry.fields[JobField.COMPLETING] = token
                return Claim.CLAIMED
            if JobField.HOOK_DONE in entry.fields:
                return Claim.RAN
            if current == token:
                return Claim.CLAIMED
            if task_id and current.startswith(task_id + "/"):
                return Claim.DIED
            return Claim.BUSY

    def mark_hook_done(self, job_id: str, message: str = "") -> None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is not None:
                entry.fields[JobField.HOOK_DONE] = message

    def mark_completion_resent(self, job_id: str, now: float) -> None:
        with self._table.lock:
            entry = self._table.jobs.get(job_id)
            if entry is not None:
                entry.fields[JobField.COMPLETION_RESENT_AT] = repr(now)


class MemoryJobStore(MemoryJobRecords, MemoryBatchLedger, MemoryCompletionClaims):
    """All three parts over one table: the in-memory twin of `JobStore`."""

    def __init__(self) -> None:
        super().__init__(MemoryJobTable())
