"""A job's completion: `on_job_complete` at most once, then the job's final status, whatever Redis does.

The recording of a job's last batch (or the seal, when the batches were faster) sends the
completion task once. That send is not the only way the task comes: its reply may be lost to a
Redis stall, the node may die before sending it, and beat re-sends the completion of a job whose
batches are all recorded but which has not ended after a grace period (`beat/completions.py`).
So the task may arrive several times, and each copy is judged by a claim in the job store
(`CompletionClaims.claim_completion`): the first claimant runs the hook; a copy arriving after the hook
ran only settles the job's status; a redelivery of a claimant that died before the hook was
marked done fails the job (the hook may or may not have run, and it never runs twice); any other
copy leaves it to the claimant.

A Redis error is not "the job vanished": the task repeats its work with backoff until it is done
(the hook is not run again by a repeat: the run remembers it ran). Only a job whose record is
gone (`JobNotFound`) is given up.

`JobCompletion` is built once per process with the collaborators it uses (the job store, the node
registry, placement, the process's job predictors); it never calls back into the runner.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from foundation.errors import JobNotFound, PredictorError, SluiceError
from foundation.redis_clients import TRANSIENT_ERRORS
from jobs.batch.job import ACTIVE_STATUSES, Job, JobStatus
from jobs.batch.outputs import write_manifest
from jobs.batch.predictors import JobPredictor, JobPredictors
from jobs.batch.status import job_status_view
from jobs.batch.time_limit import hook_time_limit, timed_out_message
from jobs.nodes.registry import NodeRegistry
from jobs.placement.batch import JobPlacement
from jobs.store import Claim, JobState, JobStorage, new_token
from jobs.transport.delivery import COMPLETION_ENTRY, Delivery, inflight_entry
from predictors_runtime.loader import error_text

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.2
MAX_RETRY_S = 5.0
DIED_MESSAGE = "a worker died while running on_job_complete; it was not run again"


class JobCompletion:
    """What a process needs to complete jobs; `finish` is the completion task."""

    def __init__(
        self, store: JobStorage, nodes: NodeRegistry, placement: JobPlacement, predictors: JobPredictors,
        local_roots: tuple[str, ...], sleep: Callable[[float], Any] = time.sleep,
    ) -> None:
        """`store`: the job's records, batches and claim; `local_roots`: where local outputs may be
        written; `sleep`: how the task waits between repeats after a Redis error."""
        self.store = store
        self.nodes = nodes
        self.placement = placement
        self.predictors = predictors
        self.local_roots = local_roots
        self.sleep = sleep

    def finish(self, job_id: str, delivery: Delivery | None = None) -> None:
        """The completion task: repeat the run with backoff on Redis errors until it is done."""
        run = CompletionRun(self, job_id, delivery)
        delay = FIRST_RETRY_S
        while True:
            try:
                run.attempt()
                break
            except TRANSIENT_ERRORS as e:
                log.warning("completing job %s failed (%s: %s); trying again in %.1f s",
                            job_id, type(e).__name__, e, delay)
                self.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_S)
        if delivery is not None:
            try:
                self.nodes.end_delivery(delivery)
            except TRANSIENT_ERRORS as e:  # the entry is settled later: the job has ended, so it is acknowledged
                log.warning("taking job %s's completion off node %s failed: %s", job_id, delivery.node, e)


def final_status(
    job: Job, final: JobState, message: str, failed_batches: Callable[[str], list[dict[str, Any]]],
) -> tuple[JobStatus, str]:
    """A completed job's status and message: succeeded, or completed with failures; a task job whose
    `Task` raised is `status_worker_error` with the task's error as its message."""
    if job.is_task and final.failed:
        errors = [str(batch.get("error", "")) for batch in failed_batches(job.job_id)]
        return JobStatus.WORKER_ERROR, "; ".join(filter(None, [*errors, message])) or "the task failed"
    succeeded = final.failed == 0 and not message
    return (JobStatus.SUCCEEDED if succeeded else JobStatus.COMPLETED_WITH_FAILURES), message


class CompletionRun:
    """One delivery of a job's completion task; `attempt()` may be repeated after a Redis error."""

    def __init__(self, completion: JobCompletion, job_id: str, delivery: Delivery | None) -> None:
        self.completion = completion
        self.job_id = job_id
        self.delivery = delivery
        self.task_id = delivery.task_id if delivery else ""
        self.token = f"{self.task_id}/{new_token()}"
        self.hook_message: str | None = None  # set once this run has called the hook
        self.end_process: Callable[[int], Any] = os._exit  # how a hook past its time limit is stopped

    def attempt(self) -> None:
        store = self.completion.store
        try:
            state = store.state(self.job_id)
        except JobNotFound:
            log.warning("job %s vanished before its completion", self.job_id)
            return
        job = state.job
        if state.status not in ACTIVE_STATUSES:  # ended: stopped, timed out, or completed by another copy
            self.completion.predictors.forget(self.job_id)
            return
        if not state.all_recorded:
            log.warning("a completion of job %s came before all its batches were recorded; ignored", self.job_id)
            return
        if self.delivery is not None:  # given back if this node dies while completing
            self.completion.nodes.begin_delivery(self.delivery, inflight_entry(self.job_id, COMPLETION_ENTRY))
        if self.hook_message is None:
            predictor: JobPredictor | None = None
            if not state.completion_claimed:  # build before claiming: a node dying while it builds costs nothing
                try:
                    predictor = self.completion.predictors.predictor_for(job)
                except PredictorError as e:
                    self._fail(job, e.message)
                    return
            claim = store.claim_completion(self.job_id, self.token, self.task_id)
            if claim is Claim.GONE:
                return
            if claim is Claim.BUSY:
                log.info("job %s: another delivery is completing it", self.job_id)
                return
            if claim is Claim.DIED:
                self._fail(job, DIED_MESSAGE)
                return
            if claim is Claim.CLAIMED:
                if not self._run_hook(job, state, predictor):
                    return
            else:  # Claim.RAN: another delivery ran the hook; its outcome is recorded with it
                self.hook_message = store.state(self.job_id).hook_message or ""
        store.mark_hook_done(self.job_id, self.hook_message or "")
        self._settle(job, self.hook_message or "")

    def _run_hook(self, job: Job, state: JobState, predictor: JobPredictor | None) -> bool:
        """Call `on_job_complete`; False if the job failed instead (its predictor cannot be built)."""
        if predictor is None:
            try:
                predictor = self.completion.predictors.predictor_for(job)
            except PredictorError as e:
                self._fail(job, e.message)
                return False
        message = ""
        try:
            with hook_time_limit(job.batch_timeout, lambda: self._hook_timed_out(job), self.end_process):
                predictor.on_job_complete(job_status_view(state))
        except Exception as e:  # noqa: BLE001 - last-resort boundary: the user's hook may raise anything; the job
            # completes with failures
            message = f"on_job_complete raised: {error_text(e)}"
            log.error("job %s: %s", self.job_id, message)
        self.hook_message = message
        return True

    def _hook_timed_out(self, job: Job) -> None:
        """The hook ran past the job's batch time limit: the job completes with that failure (the
        process ends next; a redelivered completion finds the hook done and settles nothing twice)."""
        message = f"on_job_complete {timed_out_message(job.batch_timeout)}"
        log.error("job %s: %s; ending this node process", self.job_id, message)
        self.completion.store.mark_hook_done(self.job_id, message)
        self._settle(job, message)

    def _settle(self, job: Job, message: str) -> None:
        """Write the output manifest and the job's final status; repeatable."""
        store = self.completion.store
        if job.output is not None:
            parts, failed = store.parts(self.job_id), store.failed_batches(self.job_id)
            try:
                write_manifest(job.output, self.job_id, job.total_batch_count, parts, failed,
                               local_roots=self.completion.local_roots)
            except (SluiceError, OSError) as e:  # storage refused it: the rows are there, the manifest is not
                problem = f"writing the output manifest failed: {error_text(e)}"
                message = "; ".join(filter(None, [message, problem]))
                log.error("job %s: %s", self.job_id, problem)
        final = store.state(self.job_id)
        status, message = final_status(job, final, message, store.failed_batches)
        store.transition(self.job_id, status, message=message)
        self.completion.placement.release(job, final.nodes)
        self.completion.predictors.forget(self.job_id)

    def _fail(self, job: Job, message: str) -> None:
        if self.completion.store.transition(self.job_id, JobStatus.WORKER_ERROR, message=message):
            log.error("job %s: %s: %s", self.job_id, JobStatus.WORKER_ERROR.value, message)
            self.completion.placement.release(job)
        self.completion.predictors.forget(self.job_id)

