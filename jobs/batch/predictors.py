"""The job predictors of one worker process: built once per job on first use, kept for the job, dropped after.

A node runs batches of many jobs one after another; building a job's predictor (unpacking its
bundle, loading its models) is the expensive part, so it is kept until the job ends. The batch
steps (`jobs/batch/steps.py`) and the completion (`jobs/batch/completion.py`) both ask `JobPredictors`
for a job's predictor, and tell it to forget a job that ended; neither knows how one is built
(`PredictorBuilder`: from the job's bundle in `BundlePredictors`, from a test's hand in fast tests).
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any, Protocol

import redis

from foundation.api_kinds import ApiKind
from foundation.settings import Settings
from jobs.batch.job import Job
from jobs.predictor_cache import BuildOutcomes, PredictorCache, build_outcome
from jobs.store import JobRecords
from predictors_runtime.batch_predictor import BatchPredictor
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig
from predictors_runtime.environments import HostEnvironments
from predictors_runtime.environments.remote import start_in_environment
from predictors_runtime.task_predictor import TaskPredictor

log = logging.getLogger(__name__)

# Shortest time between two looks for predictors of jobs that ended elsewhere.
SWEEP_INTERVAL_S = 5.0


class JobPredictor(Protocol):
    """What the batch path asks of a job's predictor (`predictors_runtime.batch_predictor.BatchPredictor`)."""

    def predict(self, payload: Any, batch_id: str) -> Any:
        """The user's `predict` on one batch's items."""

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        """The user's `on_job_complete`, if it has one."""

    def close(self) -> None:
        """Drop the predictor and its models."""


class PredictorBuilder(Protocol):
    """Builds a job's predictor, and cleans up after one is closed."""

    def build(self, job: Job) -> JobPredictor:
        """The job's predictor; `PredictorError` when it cannot be built (the job fails)."""

    def discard(self, job_id: str, job: Job | None) -> None:
        """What building the job's predictor left on this host may go (its model cache, its bundle folder)."""


class BundlePredictors:
    """`PredictorBuilder` from the job's bundle, with models cached under `<cache_dir>/models/<job id>`.

    A job whose API has an environment of its own (`Job.environment`) has its predictor built in a
    process of that environment (`predictors_runtime/environments/remote.py`), the environment
    built on this host first if it is not here yet.
    """

    def __init__(self, bundles: BundleStore, settings: Settings, environments: HostEnvironments | None = None) -> None:
        self._bundles = bundles
        self._cache_dir = Path(settings.cache_dir).expanduser()
        self._poll_interval_s = settings.model_poll_interval_s
        self._environments = environments or HostEnvironments.under(settings.cache_dir)

    def build(self, job: Job) -> JobPredictor:
        folder = self._bundles.local_folder(job.bundle)
        api = ApiConfig.from_dict(job.api_spec)
        log.info("building predictor of api %s for job %s", job.api_name, job.job_id)
        if job.environment:
            recipe = {"kind": "task" if api.kind == ApiKind.TASK.value else "batch",
                      "job_spec": job.predictor_job_spec(),
                      "job_config": job.config, "model_cache_dir": str(self._cache_dir / "models" / job.job_id),
                      "poll_interval_s": self._poll_interval_s}
            return start_in_environment(self._environments, job.environment, folder, api, recipe)
        if api.kind == ApiKind.TASK.value:
            return TaskPredictor.build(folder, api, job.predictor_job_spec(), job.config,
                                       model_cache_dir=self._cache_dir / "models" / job.job_id)
        return BatchPredictor.build(
            folder, api, job.predictor_job_spec(), job.config,
            model_cache_dir=self._cache_dir / "models" / job.job_id, poll_interval_s=self._poll_interval_s,
        )

    def discard(self, job_id: str, job: Job | None) -> None:
        shutil.rmtree(self._cache_dir / "models" / job_id, ignore_errors=True)
        if job is not None:  # its bundle folder may now be evicted from this host's cache
            self._bundles.release(job.bundle)


class JobPredictors:
    """Per process: each job's record (read once) and predictor (built once), until the job is forgotten."""

    def __init__(self, records: JobRecords, builder: PredictorBuilder, outcomes: BuildOutcomes | None = None) -> None:
        self._records = records
        self._builder = builder
        self._outcomes = outcomes
        self._lock = threading.Lock()  # the node's main thread builds; a hook's watchdog may forget
        self._jobs: dict[str, Job] = {}
        self._predictors: PredictorCache[JobPredictor, Job] = PredictorCache()
        self._last_sweep = 0.0

    def job(self, job_id: str) -> Job:
        """The job's record, read once per process."""
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = self._records.get(job_id)
        return job

    def predictor_for(self, job: Job, node: str | None = None) -> JobPredictor:
        """The job's predictor in this process, built once per (API version, job). While it builds,
        the job's status says so (its phase, until a first batch ends), naming `node`."""
        predictor = self._predictors.current(job.job_id, job.bundle)
        if predictor is not None:
            return predictor
        where = f" on {node}" if node else ""
        environment = " and its environment" if job.environment else ""
        self._note(job, f"building the predictor{environment}{where}")
        with build_outcome(self._outcomes, job.api_name, job.bundle):
            predictor = self._builder.build(job)
        self._predictors.put(job.job_id, job.bundle, predictor, job)
        self._note(job, f"running the first batches{where}")
        return predictor

    def _note(self, job: Job, note: str) -> None:
        """Only a figure for people: Redis failing here must not fail the batch."""
        try:
            self._records.note_predictor(job.job_id, note)
        except redis.RedisError as e:
            log.warning("could not note job %s's predictor (%s): %s", job.job_id, note, e)

    def forget(self, job_id: str) -> None:
        """Close the job's predictor (if built here) and drop what this process holds of the job."""
        with self._lock:
            self._jobs.pop(job_id, None)
        taken = self._predictors.take(job_id)
        if taken is not None:
            predictor, job = taken
            predictor.close()
            self._builder.discard(job_id, job)

    def sweep(self, current_job_id: str, now: float) -> None:
        """Drop the predictors of jobs that have ended elsewhere (stopped, timed out, finished)."""
        others = [j for j in self._predictors.held_keys() if j != current_job_id]
        if not others or now - self._last_sweep < SWEEP_INTERVAL_S:
            return
        self._last_sweep = now
        for job_id, status in self._records.statuses(others).items():
            if status is None or status.is_terminal:
                self.forget(job_id)
