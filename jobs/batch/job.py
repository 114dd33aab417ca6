"""The job record: what a submitted job is, and the statuses it moves through."""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from foundation.api_kinds import ApiKind


class JobStatus(StrEnum):
    """Status of a batch job, spelled as Cortex spells it."""

    ENQUEUING = "status_enqueuing"
    RUNNING = "status_running"
    ENQUEUE_FAILED = "status_enqueue_failed"
    COMPLETED_WITH_FAILURES = "status_completed_with_failures"
    SUCCEEDED = "status_succeeded"
    UNEXPECTED_ERROR = "status_unexpected_error"
    WORKER_ERROR = "status_worker_error"
    WORKER_OOM = "status_worker_oom"
    TIMED_OUT = "status_timed_out"
    STOPPED = "status_stopped"

    @property
    def is_terminal(self) -> bool:
        """An ended job: nothing of it runs any more, and its status never changes again."""
        return self in TERMINAL_STATUSES


# The one definition of which statuses are still moving; every other module (and the Python
# client, by value) derives from these two.
ACTIVE_STATUSES: tuple[JobStatus, ...] = (JobStatus.ENQUEUING, JobStatus.RUNNING)
TERMINAL_STATUSES: frozenset[JobStatus] = frozenset(JobStatus) - frozenset(ACTIVE_STATUSES)

# What reading or judging a damaged job record raises (JSON that does not parse, a field of the
# wrong type, one missing, a number too large to add a time to): a step that goes over every job
# logs and skips such a record instead of failing the others (see beat/steps.py).
BAD_RECORD_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, ArithmeticError)


def new_job_id(now: float | None = None) -> str:
    """A job id that sorts by submission time: milliseconds in hex, then random hex."""
    millis = int((time.time() if now is None else now) * 1000)
    return f"{millis:012x}{secrets.token_hex(4)}"


def iso_time(epoch: float) -> str:
    """RFC 3339 UTC time, the form job specs carry."""
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat().replace("+00:00", "Z")


def job_queue_name(job_id: str) -> str:
    """The Celery queue that carries one job's batches and its completion task."""
    return f"job.{job_id}"


@dataclass(frozen=True)
class Job:
    """Everything fixed at submission time; the moving parts (status, counts) live in the store."""

    job_id: str
    api_name: str
    workers: int
    config: dict[str, Any]
    timeout: int | None
    total_batch_count: int
    start_time: float
    # Not part of the public spec: how the job runs.
    api_spec: dict[str, Any] = field(default_factory=dict)
    bundle: str = ""
    hardware_queue: str = "cpu"
    tries: int = 1
    retry_of: str | None = None
    source: str = "item_list"
    output: dict[str, Any] | None = None
    # Seconds one try of a batch may run (jobs/batch/time_limit.py); None: no limit.
    batch_timeout: float | None = None

    kind: str = ApiKind.BATCH
    # The API's environment as locked at deploy (`DeployedApi.environment`); None: Sluice's own.
    environment: dict[str, Any] | None = None

    @property
    def queue(self) -> str:
        return job_queue_name(self.job_id)

    @property
    def is_task(self) -> bool:
        """A TaskAPI's job: one run of its `Task`, recorded as the job's one batch."""
        return self.kind == ApiKind.TASK

    def spec(self) -> dict[str, Any]:
        """The public job spec returned at submission and inside `job_status`."""
        common = {"job_id": self.job_id, "api_name": self.api_name, "kind": self.kind, "workers": self.workers,
                  "config": self.config, "timeout": self.timeout}
        if self.is_task:  # Cortex's task job spec
            return {**common, "created_time": iso_time(self.start_time)}
        return {
            **common,
            "total_batch_count": self.total_batch_count,
            "start_time": iso_time(self.start_time),
            **({"output": self.output} if self.output else {}),
            **({"batch_timeout": self.batch_timeout} if self.batch_timeout is not None else {}),
            **({"retry_failed_of": self.retry_of} if self.retry_of else {}),
        }

    def predictor_job_spec(self) -> dict[str, Any]:
        """The `job_spec` argument handed to a predictor's constructor."""
        spec = self.spec()
        for internal in ("kind", "timeout", "output", "retry_failed_of", "batch_timeout", "created_time"):
            spec.pop(internal, None)
        return spec

    def to_dict(self) -> dict[str, Any]:
        """Every persisted field, in one place."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Job:
        return cls(**data)
