"""What the job store answers with: a job's state, a batch's start, what a record or a claim did.

Plain values shared by every backend (`JobStore` in Redis, `MemoryJobStore` in memory) and by what
reads them (the API's `job_status`, beat's steps, the batch steps, the completion).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from foundation.errors import JobNotFound
from foundation.redis_clients import text
from jobs.batch.job import Job, JobStatus

# How long an ended job's keys are kept (`Settings.job_ttl_s` overrides it).
DEFAULT_JOB_TTL_S = 7 * 24 * 3600


def not_found(job_id: str, api_name: str | None) -> JobNotFound:
    """The error for a job that is unknown, or not of `api_name` when one is given."""
    return JobNotFound(f"job {job_id} not found" + (f" for api {api_name}" if api_name else ""))


class Recorded(IntEnum):
    """What recording a batch outcome did."""

    DUPLICATE = 0  # already counted: a redelivery
    COUNTED = 1
    COMPLETED_JOB = 2  # the last batch of a sealed job: send its completion task

    def __bool__(self) -> bool:
        return self is not Recorded.DUPLICATE


class Claim(StrEnum):
    """What asking to run a job's `on_job_complete` got (see `jobs/store/lua/claim_completion.lua`)."""

    CLAIMED = "claimed"  # run it
    RAN = "ran"  # it has run: only the job's final status is left to settle
    DIED = "died"  # an earlier delivery of this same task claimed it and died: never run it again
    BUSY = "busy"  # another delivery holds it now
    GONE = "gone"  # the job's record is gone


def new_token() -> str:
    """A token for one call: a repeat of that call carries it, no other call does.

    Every call may reach Redis more than once (the client sends a command again when its reply did
    not come, `foundation/redis_clients.py`), so a call whose answer only one caller may hear (this
    transition moved the job, this record completed it) remembers its token with the change and
    answers a repeat as it answered the first run.
    """
    return uuid.uuid4().hex


@dataclass(frozen=True)
class BatchStart:
    """What a worker learns when it picks up a batch."""

    status: JobStatus | None
    already_recorded: bool
    deliveries: int
    timed_out_tries: int = 0  # tries earlier deliveries used up by the batch time limit


def batch_start(reply: Any) -> BatchStart:
    """The begin script's reply (`lua/begin_batch.lua`: status, recorded?, deliveries, timed-out tries) read."""
    raw_status, done, deliveries, timed_out = reply
    status = JobStatus(text(raw_status)) if raw_status else None
    return BatchStart(status=status, already_recorded=bool(done), deliveries=int(deliveries),
                      timed_out_tries=int(timed_out))


@dataclass(frozen=True)
class JobState:
    """The moving parts of a job, read in one go (the fields of `jobs/store/schema.py`)."""

    job: Job
    status: JobStatus
    succeeded: int
    failed: int
    time_total: float
    end_time: float | None
    message: str
    nodes: list[str]
    # What a node last said of the job's predictor (`JobField.PREDICTOR_NOTE`); '' before any did.
    predictor_note: str = ""
    # When every batch was recorded (the completion task was then due); None before.
    finishing_at: float | None = None
    completion_claimed: bool = False
    # `on_job_complete` has run; its problem, if it raised ('' if not), else None.
    hook_message: str | None = None
    completion_resent_at: float | None = None
    # How many batches the job has, fixed once all were published (None while enqueueing).
    sealed_total: int | None = None

    @property
    def all_recorded(self) -> bool:
        return self.finishing_at is not None

    @property
    def batches_in_queue(self) -> int:
        if self.status.is_terminal:
            return 0
        return max(self.job.total_batch_count - self.succeeded - self.failed, 0)

    @property
    def average_time_per_batch(self) -> float | None:
        done = self.succeeded + self.failed
        return self.time_total / done if done else None


# A batch's items, or where they live (a JSON-lines byte range in storage): what a batch carries.
Payload = tuple[Any, dict[str, Any] | None]


def failed_batch_record(index: int, error: str, tries: int, payload: Any,
                        payload_ref: dict[str, Any] | None = None) -> str:
    """What is kept of a failed batch (its error, tries, and its items or where they live), as stored."""
    record = {"index": index, "error": error, "tries": tries, "payload": payload}
    if payload_ref is not None:
        record["payload_ref"] = payload_ref
    return json.dumps(record, default=str)
