"""What a worker does with a batch: run it through its steps, then record its outcome exactly once.

Fast: the job store is the in-memory one (it passes the store's contract tests), the broker is
kombu's in-memory transport, and the job's predictor is one already built in this process (a
small class here, in place of a user's). The figures, log streams and time-limit bookkeeping go to
a real redis-server. Nothing here waits: each batch runs in the test's own thread.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis
from celery import Celery

from jobs.batch_steps import LOST_DELIVERY_ALLOWANCE, batch_id_of
from jobs.job import Job, JobStatus
from jobs.memory_store import MemoryJobStore
from jobs.nodes import Nodes
from jobs.runner import WorkerRuntime
from jobs.services import Services
from foundation.settings import Settings
from jobs.tasks import FINISH_JOB

T0 = 1_700_000_000.0


class Predictor:
    """Answers each item doubled; raises on the first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[Any, str]] = []

    def predict(self, payload: Any, batch_id: str) -> list[Any]:
        self.calls.append((payload, batch_id))
        if len(self.calls) <= self.failures:
            raise ValueError(f"bad luck on call {len(self.calls)}")
        return [item * 2 for item in payload]

    def close(self) -> None:
        pass


class RecordingPlacement:
    def __init__(self) -> None:
        self.released: list[str] = []

    def release(self, job: Job, nodes: list[str] | None = None) -> None:
        self.released.append(job.job_id)


@pytest.fixture
def runtime(redis_client: redis.Redis, tmp_path: Path) -> Iterator[WorkerRuntime]:
    kwargs = redis_client.connection_pool.connection_kwargs
    settings = Settings(redis_url=f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}",
                        cache_dir=str(tmp_path / "cache"), local_input_roots=(str(tmp_path),))
    celery = Celery("sluice-test", broker="memory://", set_as_current=False)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    services = Services(
        settings=settings, celery=celery, redis=redis_client, store=MemoryJobStore(),  # type: ignore[arg-type]
        nodes=Nodes(redis_client, celery, settings.node_ttl_s), placement=RecordingPlacement(),  # type: ignore[arg-type]
        bundles=None,  # type: ignore[arg-type]
    )
    runtime = WorkerRuntime(services)
    yield runtime
    logging.getLogger().removeHandler(runtime.logs)
    runtime.logs.close()
    runtime.figures.close()


def running_job(runtime: WorkerRuntime, predictor: Predictor, batches: int = 2, **fields: Any) -> Job:
    """A job whose `batches` batches are all published, with its predictor built in this process."""
    job = Job(job_id=f"job-{len(runtime.services.store.list_ids('iris'))}", api_name="iris", workers=1, config={},
              timeout=None, total_batch_count=batches, start_time=T0, tries=fields.pop("tries", 2), **fields)
    runtime.services.store.create(job, JobStatus.RUNNING)
    runtime.services.store.seal(job.job_id, batches)
    runtime._predictors[job.job_id] = predictor  # type: ignore[assignment]  # built already
    return job


def sent_tasks(runtime: WorkerRuntime, job: Job) -> list[tuple[str, list[Any]]]:
    with runtime.services.celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(job.queue)
        try:
            return [(m.headers["task"], m.payload[0]) for m in (queue.get(timeout=1) for _ in range(len(queue)))]
        finally:
            queue.close()


def test_each_batch_is_predicted_once_and_the_last_one_sends_the_jobs_completion(runtime: WorkerRuntime) -> None:
    predictor = Predictor()
    job = running_job(runtime, predictor)

    runtime.run_batch(job.job_id, 0, [1, 2])
    assert sent_tasks(runtime, job) == []
    runtime.run_batch(job.job_id, 1, [3])

    assert predictor.calls == [([1, 2], batch_id_of(job.job_id, 0)), ([3], batch_id_of(job.job_id, 1))]
    state = runtime.services.store.state(job.job_id)
    assert (state.succeeded, state.failed, state.all_recorded) == (2, 0, True)
    assert sent_tasks(runtime, job) == [(FINISH_JOB, [job.job_id])]


def test_a_redelivered_batch_that_was_recorded_does_not_run_again(runtime: WorkerRuntime) -> None:
    predictor = Predictor()
    job = running_job(runtime, predictor)
    runtime.run_batch(job.job_id, 0, [1])

    runtime.run_batch(job.job_id, 0, [1])

    assert len(predictor.calls) == 1
    assert runtime.services.store.state(job.job_id).succeeded == 1


def test_a_try_that_raises_is_retried_and_the_batch_succeeds_on_the_next(runtime: WorkerRuntime) -> None:
    predictor = Predictor(failures=1)
    job = running_job(runtime, predictor, tries=2)

    runtime.run_batch(job.job_id, 0, [1])

    assert len(predictor.calls) == 2
    assert (runtime.services.store.state(job.job_id).succeeded, runtime.services.store.failed_batches(job.job_id)) == (1, [])


def test_a_batch_failing_every_try_is_kept_as_failed_with_its_last_error_and_payload(runtime: WorkerRuntime) -> None:
    job = running_job(runtime, Predictor(failures=3), tries=3)

    runtime.run_batch(job.job_id, 1, [7, 8])

    [failed] = runtime.services.store.failed_batches(job.job_id)
    assert (failed["index"], failed["tries"], failed["payload"]) == (1, 3, [7, 8])
    assert "ValueError: bad luck on call 3" in failed["error"]


def test_nothing_of_a_stopped_job_runs(runtime: WorkerRuntime) -> None:
    predictor = Predictor()
    job = running_job(runtime, predictor)
    runtime.services.store.transition(job.job_id, JobStatus.STOPPED)

    runtime.run_batch(job.job_id, 0, [1])

    assert predictor.calls == []
    assert runtime.services.store.recorded_indexes(job.job_id) == set()


def test_a_batch_whose_process_died_more_often_than_its_tries_allow_fails_without_running(
    runtime: WorkerRuntime,
) -> None:
    predictor = Predictor()
    job = running_job(runtime, predictor, tries=1)
    for _ in range(1 + LOST_DELIVERY_ALLOWANCE):  # deliveries whose process died before recording
        runtime.services.store.begin_batch(job.job_id, 0)

    runtime.run_batch(job.job_id, 0, [1])

    assert predictor.calls == []
    [failed] = runtime.services.store.failed_batches(job.job_id)
    assert failed["error"] == f"the worker process running this batch died {1 + LOST_DELIVERY_ALLOWANCE} times " \
                              "(killed, or out of memory)"


def test_a_batch_carried_by_reference_is_read_from_its_file_and_its_rows_written_as_an_output_part(
    runtime: WorkerRuntime, tmp_path: Path
) -> None:
    source = tmp_path / "input.jsonl"
    source.write_text("1\n2\n3\n")
    predictor = Predictor()
    job = running_job(runtime, predictor, batches=1, output={"path": str(tmp_path / "out"), "format": "jsonl"})
    ref = {"uri": str(source), "start": 0, "end": source.stat().st_size, "first_line": 1, "lines": 3}

    runtime.run_batch(job.job_id, 0, None, ref)

    assert predictor.calls[0][0] == [1, 2, 3]
    assert runtime.services.store.parts(job.job_id) == {0: 3}
    part = tmp_path / "out" / job.job_id / "part-00000.jsonl"
    assert [json.loads(line) for line in part.read_text().splitlines()] == [2, 4, 6]


def test_a_batch_whose_input_file_vanished_is_failed_naming_the_reading_and_keeps_where_its_items_were(
    runtime: WorkerRuntime, tmp_path: Path
) -> None:
    predictor = Predictor()
    job = running_job(runtime, predictor, batches=1)
    ref = {"uri": str(tmp_path / "gone.jsonl"), "start": 0, "end": 10, "first_line": 1, "lines": 2}

    runtime.run_batch(job.job_id, 0, None, ref)

    assert predictor.calls == []
    [failed] = runtime.services.store.failed_batches(job.job_id)
    assert failed["error"].startswith("reading the batch's input failed: ")
    assert (failed["payload"], failed["payload_ref"]) == (None, ref)
