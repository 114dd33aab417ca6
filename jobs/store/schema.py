"""The job hash: every field a job's hash (`foundation.keys.job`) holds, named and described once.

Each backend writes these fields and nothing else: the Redis store through its Lua scripts
(`jobs/store/lua/`, which spell the names out; `tests/unit/test_store_schema.py` holds them to this
list) and its Python calls, the in-memory store into a dict shaped like the hash. Both read a job
back through `job_state`, so a field parses the same whichever store holds it. The companion keys
of a job (its done set, failed batches, delivery counts, parts and kept payloads) are named in
`foundation/keys.py`.

Who writes what: the job records (`records.py`) own the record, the status and what goes with it;
the batch ledger (`ledger.py`) the counters and the fan-in; the completion claims (`claims.py`) who
runs `on_job_complete`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import StrEnum

from jobs.batch.job import Job, JobStatus
from jobs.store.values import JobState


class JobField(StrEnum):
    """A field of a job's hash. Values are stored as text; numbers as Python's `repr` or Redis's integers."""

    # -- the job records ---------------------------------------------------------------------
    RECORD = "record"
    """The job as submitted (`Job.to_dict()` as JSON); rewritten once enqueueing knows its batch count.
    Its presence is what "the job exists" means to every script."""
    STATUS = "status"
    """A `JobStatus` value; moved only by the transition script, and never off a terminal one."""
    MOVED_BY = "moved_by"
    """The token of the transition that last moved the status: a repeat of that call is told it moved the job."""
    END_TIME = "end_time"
    """Epoch seconds the job ended (a terminal status); absent while it is active."""
    MESSAGE = "message"
    """Why the job ended as it did, for the user ('' or absent when there is nothing to say)."""
    NODES = "nodes"
    """The worker nodes consuming the job's queue (a JSON list), as placement last chose them."""
    ENQUEUE_SEEN = "enqueue_seen"
    """Epoch seconds the enqueuer last showed it was alive; beat fails a job whose enqueuer went silent."""
    PREDICTOR_NOTE = "predictor_note"
    """What a node last said it does with the job's predictor ("building the predictor on <node>"),
    for the job's phase until its first batch ends; absent before any node took a batch."""

    # -- the batch ledger --------------------------------------------------------------------
    SUCCEEDED = "succeeded"
    """How many batches were recorded as succeeded (each index once)."""
    FAILED = "failed"
    """How many batches were recorded as failed after all their tries (each index once)."""
    TIME_TOTAL = "time_total"
    """Seconds all recorded batches ran, summed (for the average time per batch)."""
    SEALED_TOTAL = "sealed_total"
    """How many batches the job has, fixed once all were published; absent while enqueueing."""
    FINISHING = "finishing"
    """The token of the one call told that every batch is recorded (it sends the completion task)."""
    FINISHING_AT = "finishing_at"
    """Epoch seconds every batch was recorded; beat re-sends the completion of a job left unended after it."""

    # -- the completion claims ---------------------------------------------------------------
    COMPLETING = "completing"
    """The claim token ("<task id>/<nonce>") of the delivery that may run `on_job_complete`."""
    HOOK_DONE = "hook_done"
    """`on_job_complete` has run: how it failed ('' if it did not); it never runs again."""
    COMPLETION_RESENT_AT = "completion_resent_at"
    """Epoch seconds beat last sent the job's completion task again."""


def new_job_hash(job: Job, status: JobStatus) -> dict[str, str]:
    """The fields a new job starts with."""
    return {
        JobField.RECORD: json.dumps(job.to_dict()),
        JobField.STATUS: status.value,
        JobField.SUCCEEDED: "0",
        JobField.FAILED: "0",
        JobField.TIME_TOTAL: "0",
        JobField.NODES: "[]",
        JobField.ENQUEUE_SEEN: repr(job.start_time),
    }


def _float(text: str | None) -> float | None:
    return float(text) if text else None


def job_state(fields: Mapping[str, str]) -> JobState:
    """A job's state from its hash, whichever store read it (a damaged field raises ValueError,
    TypeError or KeyError: see `jobs.batch.job.BAD_RECORD_ERRORS`)."""
    sealed_total = fields.get(JobField.SEALED_TOTAL)
    return JobState(
        job=Job.from_dict(json.loads(fields[JobField.RECORD])),
        status=JobStatus(fields[JobField.STATUS]),
        succeeded=int(fields.get(JobField.SUCCEEDED, 0)),
        failed=int(fields.get(JobField.FAILED, 0)),
        time_total=float(fields.get(JobField.TIME_TOTAL, 0)),
        end_time=_float(fields.get(JobField.END_TIME)),
        message=fields.get(JobField.MESSAGE, ""),
        nodes=json.loads(fields.get(JobField.NODES, "[]")),
        predictor_note=fields.get(JobField.PREDICTOR_NOTE, ""),
        finishing_at=_float(fields.get(JobField.FINISHING_AT)),
        completion_claimed=JobField.COMPLETING in fields,
        hook_message=fields.get(JobField.HOOK_DONE),
        completion_resent_at=_float(fields.get(JobField.COMPLETION_RESENT_AT)),
        sealed_total=int(sealed_total) if sealed_total else None,
    )
