"""A worker process's job predictors: built once per job on first use, kept for the job, dropped once it ends."""

from __future__ import annotations

from typing import Any

from jobs.batch.job import Job, JobStatus
from jobs.batch.predictors import SWEEP_INTERVAL_S, JobPredictor, JobPredictors
from jobs.store.memory import MemoryJobStore

T0 = 1_700_000_000.0


class Predictor:
    def __init__(self) -> None:
        self.closed = False

    def predict(self, payload: Any, batch_id: str) -> Any:
        return payload

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Builder:
    def __init__(self) -> None:
        self.built: dict[str, list[Predictor]] = {}
        self.discarded: list[tuple[str, str | None]] = []

    def build(self, job: Job) -> JobPredictor:
        predictor = Predictor()
        self.built.setdefault(job.job_id, []).append(predictor)
        return predictor

    def discard(self, job_id: str, job: Job | None) -> None:
        self.discarded.append((job_id, job.bundle if job else None))


def job(store: MemoryJobStore, job_id: str) -> Job:
    made = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=1,
               start_time=T0, bundle=f"bundle-{job_id}")
    store.create(made, JobStatus.RUNNING)
    return made


def test_a_jobs_predictor_is_built_once_and_kept_until_the_job_is_forgotten() -> None:
    store, builder = MemoryJobStore(), Builder()
    predictors = JobPredictors(store, builder)
    first = job(store, "a")

    assert predictors.predictor_for(first) is predictors.predictor_for(first)
    assert predictors.job("a") == first
    predictors.forget("a")

    [built] = builder.built["a"]
    assert built.closed and builder.discarded == [("a", "bundle-a")]
    assert predictors.predictor_for(first) is not built  # a job seen again is built again
    predictors.forget("never-seen")
    assert builder.discarded == [("a", "bundle-a")]


def test_a_jobs_record_is_read_once_per_process() -> None:
    store = MemoryJobStore()
    predictors = JobPredictors(store, Builder())
    job(store, "a")

    first = predictors.job("a")
    store.update_record(Job(**{**first.to_dict(), "total_batch_count": 9}))

    assert predictors.job("a").total_batch_count == 1


def test_the_predictors_of_jobs_that_ended_elsewhere_are_dropped_at_most_every_sweep_interval() -> None:
    store, builder = MemoryJobStore(), Builder()
    predictors = JobPredictors(store, builder)
    for job_id in ("current", "ended", "running"):
        predictors.predictor_for(job(store, job_id))
    store.transition("ended", JobStatus.STOPPED)

    predictors.sweep("current", now=SWEEP_INTERVAL_S)
    assert [job_id for job_id, _ in builder.discarded] == ["ended"]

    store.transition("running", JobStatus.SUCCEEDED)
    store.transition("current", JobStatus.SUCCEEDED)
    predictors.sweep("current", now=2 * SWEEP_INTERVAL_S - 0.1)
    assert [job_id for job_id, _ in builder.discarded] == ["ended"]
    predictors.sweep("current", now=2 * SWEEP_INTERVAL_S)
    assert [job_id for job_id, _ in builder.discarded] == ["ended", "running"]  # never the one running here


def test_while_a_predictor_builds_the_job_says_so_naming_the_node() -> None:
    store = MemoryJobStore()
    seen: list[str] = []

    class Watching(Builder):
        def build(self, job: Job) -> JobPredictor:
            seen.append(store.state(job.job_id).predictor_note)
            return super().build(job)

    predictors = JobPredictors(store, Watching())
    predictors.predictor_for(job(store, "a"), "celery@gpu1")

    assert seen == ["building the predictor on celery@gpu1"]
    assert store.state("a").predictor_note == "running the first batches on celery@gpu1"


def test_a_store_that_cannot_take_the_note_does_not_fail_the_build() -> None:
    import redis

    store = MemoryJobStore()

    def unreachable(job_id: str, note: str) -> None:
        raise redis.ConnectionError("Redis is down")

    store.note_predictor = unreachable  # type: ignore[method-assign]
    predictors = JobPredictors(store, Builder())
    assert predictors.predictor_for(job(store, "a"), "celery@a") is not None
