"""What a worker process does with a batch and with a job's completion.

Plain functions over `Services`, so they can be tested without Celery; `jobs/tasks.py` only
wraps them. A batch runs through a pipeline of small steps (`jobs/batch_steps.py`); its errors
are caught and recorded there and the task returns normally, so a Celery retry never runs a
batch behind Sluice's back; the recording of the job's last batch sends its completion task
(see `jobs/publish.py`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from predictors_runtime.batch_predictor import BatchPredictor
from predictors_runtime.config import ApiConfig
from foundation import figure_sink as process_figures
from foundation.json_logs import labelled

from .batch_steps import LOST_DELIVERY_ALLOWANCE, BatchRun, batch_id_of, batch_pipeline
from .completion import finish_job
from foundation.figures import Recorder
from .job import Job, JobStatus
from foundation.log_streams import install_job_log_handler
from .nodes import Delivery
from .services import Services
from .time_limit import BatchWatchdog

__all__ = ["LOST_DELIVERY_ALLOWANCE", "WorkerRuntime", "batch_id_of"]

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 5.0


class WorkerRuntime:
    """Per-process state: one predictor per job, built on first use and kept for the job."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._jobs: dict[str, Job] = {}
        self._predictors: dict[str, BatchPredictor] = {}
        self._last_sweep = 0.0
        self.time_limit = BatchWatchdog(services, hard_stop_grace_s=services.settings.hard_stop_grace_s)
        # Batches, items and model loads of this process, summed with every other's in Redis.
        self.figures = Recorder.for_url(services.settings.redis_url).start()
        process_figures.install(self.figures)
        self.logs = install_job_log_handler(services.settings)  # a job's lines also go to its log stream
        self._run = batch_pipeline(self)

    # -- predictors -------------------------------------------------------------------------
    def job(self, job_id: str) -> Job:
        """The job's record, read once per process."""
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

    def fail_job(self, job: Job, status: JobStatus, message: str) -> None:
        """End the job (its predictor could not be built, say) and drop what this process holds of it."""
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
        self._run(BatchRun(job_id, index, payload, payload_ref, delivery))

    def finish_job(self, job_id: str, delivery: Delivery | None = None) -> None:
        """The completion task: run `on_job_complete` once, then settle the job's final status
        (`jobs/completion.py`: it rides out Redis errors and duplicate copies of the task)."""
        with labelled(job_id=job_id), self.logs.capturing_job(job_id):
            finish_job(self, job_id, delivery)
