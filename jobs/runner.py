"""What a worker process does with a batch and with a job's completion.

Plain functions over `Services`, so they can be tested without Celery; `jobs/tasks.py` only
wraps them. Batch errors are caught and recorded here and the function returns normally, so a
Celery retry never runs a batch behind Sluice's back; the recording of the job's last batch
sends its completion task (see `jobs/publish.py`).
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from predictors_runtime.batch_predictor import BatchPredictor
from predictors_runtime.config import ApiConfig
from predictors_runtime.errors import PredictorError
from predictors_runtime.loader import error_text
from predictors_runtime.log import labelled

from .completion import finish_job
from .inputs import read_range
from .job import ACTIVE_STATUSES, Job, JobStatus
from .outputs import write_part
from .publish import send_completion
from .services import Services
from .store import Delivery, Recorded
from .time_limit import BatchWatchdog, timed_out_message

log = logging.getLogger(__name__)

# Deliveries of one batch beyond its tries before Sluice stops handing it to workers: each
# such delivery means the process running it died (killed, or out of memory).
LOST_DELIVERY_ALLOWANCE = 2
SWEEP_INTERVAL_S = 5.0


def batch_id_of(job_id: str, index: int) -> str:
    """A uuid for a batch, stable across redeliveries so a predictor's outputs stay idempotent."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sluice:{job_id}:{index}"))


class WorkerRuntime:
    """Per-process state: one predictor per job, built on first use and kept for the job."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._jobs: dict[str, Job] = {}
        self._predictors: dict[str, BatchPredictor] = {}
        self._last_sweep = 0.0
        self._open_delivery: Delivery | None = None
        self.time_limit = BatchWatchdog(services)

    # -- predictors -------------------------------------------------------------------------
    def _job(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = self.services.store.get(job_id)
        return job

    def predictor_for(self, job: Job) -> BatchPredictor:
        """The job's predictor in this process, built once per (API version, job)."""
        predictor = self._predictors.get(job.job_id)
        if predictor is None:
            folder = self.services.bundles.local_folder(job.bundle)
            api = ApiConfig.from_dict(job.api_spec)
            log.info("building predictor of api %s for job %s", job.api_name, job.job_id)
            settings = self.services.settings
            predictor = BatchPredictor.build(
                folder, api, job.predictor_job_spec(), job.config,
                model_cache_dir=Path(settings.cache_dir).expanduser() / "models" / job.job_id,
                poll_interval_s=settings.model_poll_interval_s,
            )
            self._predictors[job.job_id] = predictor
        return predictor

    def forget(self, job_id: str) -> None:
        predictor = self._predictors.pop(job_id, None)
        job = self._jobs.pop(job_id, None)
        if predictor is not None:
            predictor.close()
            shutil.rmtree(Path(self.services.settings.cache_dir).expanduser() / "models" / job_id, ignore_errors=True)
            if job is not None:  # its bundle folder may now be evicted from this host's cache
                self.services.bundles.release(job.bundle)

    def sweep(self, current_job_id: str, now: float) -> None:
        """Drop the predictors of jobs that have ended elsewhere (stopped, timed out, finished)."""
        others = [j for j in self._predictors if j != current_job_id]
        if not others or now - self._last_sweep < SWEEP_INTERVAL_S:
            return
        self._last_sweep = now
        for job_id, status in self.services.store.statuses(others).items():
            if status is None or status.is_terminal:
                self.forget(job_id)

    def _fail_job(self, job: Job, status: JobStatus, message: str) -> None:
        if self.services.store.transition(job.job_id, status, message=message):
            log.error("job %s: %s: %s", job.job_id, status.value, message)
            self.services.placement.release(job)
        self.forget(job.job_id)

    # -- tasks ------------------------------------------------------------------------------
    def run_batch(
        self, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None = None,
        delivery: Delivery | None = None,
    ) -> None:
        """Run one batch with retries, then record its outcome exactly once.

        `payload_ref` points at the batch's items in storage (a JSON-lines byte range) instead
        of carrying them. `delivery` (this node and the task id) is kept in the node's
        in-flight hash while the batch runs, so the batch can be given back if the node dies.
        """
        self._open_delivery = None
        try:
            with labelled(job_id=job_id, batch_index=str(index)):
                self._run_batch(job_id, index, payload, payload_ref, delivery)
        finally:
            if self._open_delivery is not None:  # entered in flight, but not recorded (the job ended)
                self.services.store.end_delivery(self._open_delivery)
                self._open_delivery = None

    def _run_batch(
        self, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None, delivery: Delivery | None
    ) -> None:
        store = self.services.store
        start = store.begin_batch(job_id, index, delivery)
        if start.status is None or start.status not in ACTIVE_STATUSES:
            return  # unknown, stopped, timed out or failed job: nothing more runs
        if start.already_recorded:
            log.info("job %s batch %d was already recorded; skipping a duplicate delivery", job_id, index)
            return
        self._open_delivery = delivery
        self.sweep(job_id, time.monotonic())
        job = self._job(job_id)
        if start.deliveries > job.tries + LOST_DELIVERY_ALLOWANCE:
            self._completes(job, store.record_failure(
                job_id, index, 0.0,
                f"the worker process running this batch died {start.deliveries - 1} times "
                "(killed, or out of memory)",
                start.deliveries - 1, payload, delivery=delivery,
            ))
            return
        try:
            with self.time_limit.while_active(job, index):
                predictor = self.predictor_for(job)
        except PredictorError as e:
            self._fail_job(job, JobStatus.WORKER_ERROR, e.message)
            return
        if payload_ref is not None:
            try:
                payload = read_range(payload_ref, self.services.settings.local_input_roots)
            except Exception as e:  # storage went away or changed under the job
                self._completes(job, store.record_failure(
                    job_id, index, 0.0, f"reading the batch's input failed: {error_text(e)}", 1, None, payload_ref,
                    delivery=delivery,
                ))
                return
        batch_id = batch_id_of(job_id, index)
        timed_out = self.time_limit.tries_timed_out(job, index)  # tries its earlier deliveries used up
        if timed_out >= job.tries:
            self._completes(job, store.record_failure(
                job_id, index, 0.0, timed_out_message(job.batch_timeout), job.tries, payload, payload_ref,
                delivery=delivery,
            ))
            return
        began = time.perf_counter()
        error = ""
        for attempt in range(timed_out + 1, job.tries + 1):
            try:
                with self.time_limit.running(job, index, attempt, payload, payload_ref):
                    result = predictor.predict(payload, batch_id)
                    if job.output is not None and isinstance(result, list):
                        rows = write_part(job.output, job_id, index, result)
                        store.record_part(job_id, index, rows)
            except Exception as e:  # the user's code failed: retry, then keep the batch as failed
                error = error_text(e)
                log.warning("job %s batch %d try %d/%d failed: %s", job_id, index, attempt, job.tries, e)
                continue
            self._completes(job, store.record_success(job_id, index, time.perf_counter() - began, delivery))
            return
        self._completes(job, store.record_failure(
            job_id, index, time.perf_counter() - began, error, job.tries, payload, delivery=delivery,
        ))

    def _completes(self, job: Job, recorded: Recorded) -> None:
        """After a batch was recorded: if it was the job's last one, send the completion task (exactly once)."""
        self._open_delivery = None  # recording took it off the node's in-flight hash
        if recorded is Recorded.COMPLETED_JOB:
            send_completion(self.services.celery, job.job_id, job.queue)

    def finish_job(self, job_id: str, delivery: Delivery | None = None) -> None:
        """The completion task: run `on_job_complete` once, then settle the job's final status
        (`jobs/completion.py`: it rides out Redis errors and duplicate copies of the task)."""
        with labelled(job_id=job_id):
            finish_job(self, job_id, delivery)
