"""The job store's three concerns, as what callers may ask of any backend.

- `JobRecords`: a job's record and status (create, read, list, move).
- `BatchLedger`: its batches (each delivery counted, each outcome recorded once, the fan-in that
  tells exactly one caller the job completed, what failed batches and output parts leave behind).
- `CompletionClaims`: who runs the job's `on_job_complete`, at most once.

A caller takes the narrowest it uses; `JobStorage` is all three, what a process's `Services` holds.
`JobStore` (Redis, `jobs/store/__init__.py`) and `MemoryJobStore` (`jobs/store/memory.py`) implement
them and pass the same contract tests (`tests/unit/test_store_contract.py` in memory,
`tests/integration/test_store_redis.py` against both).

Every call may reach Redis more than once (its reply lost to a stall): a call whose answer only one
caller may hear takes a token (`values.new_token`) and answers a repeat as it answered the first run.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from jobs.batch.job import ACTIVE_STATUSES, Job, JobStatus
from jobs.store.answers import Answer
from jobs.store.values import BatchStart, Claim, JobState, Payload, Recorded
from jobs.transport.delivery import Delivery


class JobRecords(Protocol):
    """Jobs' records and statuses."""

    def create(self, job: Job, status: JobStatus = JobStatus.ENQUEUING) -> None:
        """Write a new job record and index it under its API and among the active jobs."""

    def get(self, job_id: str, api_name: str | None = None) -> Job:
        """The job as submitted; `JobNotFound` if it is unknown (or `api_name` is not its API's)."""

    def state(self, job_id: str, api_name: str | None = None) -> JobState:
        """Everything moving about the job, read in one go; `JobNotFound` as `get`."""

    def status(self, job_id: str) -> JobStatus | None:
        """The job's status; None for an unknown job."""

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]:
        """The status of each of these jobs (None for unknown ones), read at once."""

    def list_ids(self, api_name: str, limit: int = 100) -> list[str]:
        """Job ids of an API, newest first."""

    def active_ids(self) -> list[str]:
        """Ids of the jobs that have not ended, sorted."""

    def transition(
        self, job_id: str, new_status: JobStatus, allowed_from: Iterable[JobStatus] = ACTIVE_STATUSES,
        message: str = "", now: float | None = None,
    ) -> bool:
        """Move a job to `new_status` only if its current status is one of `allowed_from`; whether it moved.

        A terminal status also stamps the end time and takes the job off the active ones; a
        terminal status is never left.
        """

    def touch_enqueue(self, job_id: str, now: float) -> None:
        """The enqueuer is alive: beat fails a job whose enqueuer went silent (see beat/steps.py)."""

    def enqueue_seen(self, job_id: str) -> float | None:
        """When the enqueuer last showed it was alive; None for an unknown job."""

    def update_record(self, job: Job) -> None:
        """Rewrite the fixed part of a job once enqueueing knows it all (e.g. its batch count)."""

    def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        """The worker nodes consuming the job's queue, as placement chose them."""

    def note_predictor(self, job_id: str, note: str) -> None:
        """What a node is doing with the job's predictor, for its status; nothing for an unknown job."""


class BatchLedger(Protocol):
    """Jobs' batches: deliveries, outcomes recorded once, the fan-in, and what batches leave behind."""

    def begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> BatchStart:
        """Check and count a delivery of a batch; one that will run is entered in its node's in-flight hash.
        Also says how many tries the batch time limit used up in earlier deliveries (read in the same step)."""

    def send_begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> Answer[BatchStart]:
        """`begin_batch` sent now, its answer read later (`jobs/store/answers.py`): what does not depend on
        the answer is done meanwhile. Its answer must be asked for: asking also makes the call where
        it could not be sent."""

    def seal(self, job_id: str, total_batch_count: int, now: float | None = None) -> bool:
        """Fix the job's batch count once all are enqueued; True if they are all recorded already.

        Exactly one caller of `seal` and the `record_*` methods is ever told that a job is complete.
        """

    def record_success(self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None) -> Recorded:
        """Count a finished batch once (and take it off its node's in-flight hash)."""

    def send_record_success(
        self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None
    ) -> Answer[Recorded]:
        """`record_success` sent now, its answer read later (`jobs/store/answers.py`). Its answer must
        be asked for: asking also makes the call where it could not be sent."""

    def record_failure(
        self, job_id: str, index: int, seconds: float, error: str, tries: int, payload: Any,
        payload_ref: dict[str, Any] | None = None, delivery: Delivery | None = None,
    ) -> Recorded:
        """Count a failed batch once and keep it (error, tries, payload or where it lives) for inspection."""

    def recorded_indexes(self, job_id: str) -> set[int]:
        """The indexes of every batch of the job whose outcome is recorded."""

    def recorded(self, job_id: str, indexes: Iterable[int]) -> dict[int, bool]:
        """Whether each of these batches of the job has its outcome recorded."""

    def keep_payloads(self, job_id: str, payloads: dict[int, Payload]) -> None:
        """Keep what each of these batches carries until its outcome is recorded (beat publishes a
        batch the broker lost again from here: `beat/lost_batches.py`)."""

    def kept_payloads(self, job_id: str, indexes: Iterable[int]) -> dict[int, Payload]:
        """(payload, payload reference) of those of `indexes` whose copy is kept."""

    def record_part(self, job_id: str, index: int, rows: int) -> None:
        """Remember the output part a batch wrote, for the job's manifest."""

    def parts(self, job_id: str) -> dict[int, int]:
        """Batch index -> rows of every output part the job's batches wrote."""

    def failed_batches(self, job_id: str) -> list[dict[str, Any]]:
        """The job's failed batches (index, error, tries, payload or payload_ref), in batch order."""

    def timed_out_tries(self, job_id: str, index: int) -> int:
        """Tries of the batch used up by the batch time limit in earlier deliveries (`jobs/batch/time_limit.py`)."""

    def mark_timed_out(self, job_id: str, index: int, tries_used: int) -> None:
        """A try of the batch ran past the time limit: `tries_used` of its tries are used up."""


class CompletionClaims(Protocol):
    """Who runs a job's `on_job_complete`: the first claimant, once (`jobs/batch/completion.py`)."""

    def claim_completion(self, job_id: str, token: str, task_id: str = "") -> Claim:
        """Ask to run the job's `on_job_complete`, which runs at most once per job.

        `token` is "<task id>/<something unique to this run of the task>"; asking again with the
        same token (a repeat after a lost reply) is answered `CLAIMED` again until the hook is done.
        """

    def mark_hook_done(self, job_id: str, message: str = "") -> None:
        """`on_job_complete` has run (`message`: how it failed, '' if it did not): it never runs again."""

    def mark_completion_resent(self, job_id: str, now: float) -> None:
        """Beat sent the job's completion task again at `now`."""


class JobStorage(JobRecords, BatchLedger, CompletionClaims, Protocol):
    """All three concerns of one backend: what a process's `Services` holds as its job store."""
