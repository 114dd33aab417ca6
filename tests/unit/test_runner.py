"""What a worker does with a batch: run it through its steps, then record its outcome exactly once.

Fast: the job store and node registry are the in-memory ones (they pass the contract tests), placement
runs over them with the in-memory job queues, the broker is kombu's in-memory transport, figures go to
an in-memory figure store, and each job's predictor is one already made in this process (a small class
here, in place of a user's). Nothing here waits: each batch runs in the test's own thread.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from foundation.errors import PredictorError
from foundation.figures import BATCHES, ITEMS, Recorder, read_figures
from foundation.memory import MemoryFigureStore
from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.predictors import JobPredictor, JobPredictors
from jobs.batch.steps import LOST_DELIVERY_ALLOWANCE, batch_id_of
from jobs.nodes.memory import MemoryNodes
from jobs.placement.batch import Placement
from jobs.runner import WorkerRuntime
from jobs.services import Services
from jobs.store.memory import MemoryJobStore
from jobs.tasks import FINISH_JOB
from jobs.transport.delivery import Delivery
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.bundles import BundleStore

T0 = 1_700_000_000.0


class Predictor:
    """Answers each item doubled; raises on the first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[Any, str]] = []
        self.closed = False

    def predict(self, payload: Any, batch_id: str) -> list[Any]:
        self.calls.append((payload, batch_id))
        if len(self.calls) <= self.failures:
            raise ValueError(f"bad luck on call {len(self.calls)}")
        return [item * 2 for item in payload]

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class Builder:
    """Stands in for building a job's predictor from its bundle: hands out the ones a test made."""

    def __init__(self) -> None:
        self.predictors: dict[str, Predictor] = {}
        self.errors: dict[str, str] = {}
        self.discarded: list[str] = []

    def build(self, job: Job) -> JobPredictor:
        if job.job_id in self.errors:
            raise PredictorError(self.errors[job.job_id])
        return self.predictors[job.job_id]

    def discard(self, job_id: str, job: Job | None) -> None:
        self.discarded.append(job_id)


class NoLogStreams:
    """A job's lines stay on stderr (log streams have tests of their own)."""

    def capturing_job(self, job_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capturing_request(self, api_name: str, request_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capturing_requests(self, api_name: str, request_ids: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@pytest.fixture
def builder() -> Builder:
    return Builder()


@pytest.fixture
def figures() -> MemoryFigureStore:
    return MemoryFigureStore()


@pytest.fixture
def recorder(figures: MemoryFigureStore) -> Recorder:
    """This process's figures, never started: a test flushes them itself."""
    return Recorder(figures)


@pytest.fixture
def queues() -> MemoryJobQueues:
    return MemoryJobQueues()


@pytest.fixture
def services(tmp_path: Path, queues: MemoryJobQueues) -> Services:
    settings = Settings(cache_dir=str(tmp_path / "cache"), local_input_roots=(str(tmp_path),))
    celery = Celery("sluice-test", broker="memory://", set_as_current=False)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    store = MemoryJobStore()
    nodes = MemoryNodes(settings.node_ttl_s, inflight=store.inflight)
    return Services(
        settings=settings, celery=celery, redis=redis.Redis(), store=store, nodes=nodes,  # a client never used
        placement=Placement(queues, store, nodes), bundles=BundleStore(str(tmp_path / "storage"), tmp_path / "cache"),
        queues=queues,
    )


@pytest.fixture
def runtime(services: Services, builder: Builder, recorder: Recorder) -> Iterator[WorkerRuntime]:
    return WorkerRuntime(services, figures=recorder, logs=NoLogStreams(),
                        predictors=JobPredictors(services.store, builder))


def running_job(services: Services, builder: Builder, predictor: Predictor, batches: int = 2, **fields: Any) -> Job:
    """A job whose `batches` batches are all published, its predictor made already."""
    job = Job(job_id=f"job-{len(services.store.list_ids('iris'))}", api_name="iris", workers=1, config={},
              timeout=None, total_batch_count=batches, start_time=T0, tries=fields.pop("tries", 2), **fields)
    services.store.create(job, JobStatus.RUNNING)
    services.store.seal(job.job_id, batches)
    builder.predictors[job.job_id] = predictor
    return job


def sent_tasks(services: Services, job: Job) -> list[tuple[str, list[Any]]]:
    with services.celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(job.queue)
        try:
            return [(m.headers["task"], m.payload[0]) for m in (queue.get(timeout=1) for _ in range(len(queue)))]
        finally:
            queue.close()


def test_each_batch_is_predicted_once_and_the_last_one_sends_the_jobs_completion(
    runtime: WorkerRuntime, services: Services, builder: Builder
) -> None:
    predictor = Predictor()
    job = running_job(services, builder, predictor)

    runtime.run_batch(job.job_id, 0, [1, 2])
    assert sent_tasks(services, job) == []
    runtime.run_batch(job.job_id, 1, [3])

    assert predictor.calls == [([1, 2], batch_id_of(job.job_id, 0)), ([3], batch_id_of(job.job_id, 1))]
    state = services.store.state(job.job_id)
    assert (state.succeeded, state.failed, state.all_recorded) == (2, 0, True)
    assert sent_tasks(services, job) == [(FINISH_JOB, [job.job_id])]


def test_recorded_batches_and_their_items_are_counted_in_the_figures_once(
    runtime: WorkerRuntime, services: Services, builder: Builder, recorder: Recorder, figures: MemoryFigureStore
) -> None:
    job = running_job(services, builder, Predictor(failures=2), tries=2)

    runtime.run_batch(job.job_id, 0, [1, 2, 3])  # fails both tries
    runtime.run_batch(job.job_id, 1, [4])
    runtime.run_batch(job.job_id, 1, [4])  # a redelivery: not counted again
    assert recorder.flush()

    totals = read_figures(figures, [BATCHES, ITEMS])
    assert totals[BATCHES.name] == {("iris", "failed"): 1, ("iris", "succeeded"): 1}
    assert totals[ITEMS.name] == {("iris",): 4}


def test_a_redelivered_batch_that_was_recorded_does_not_run_again(
    runtime: WorkerRuntime, services: Services, builder: Builder
) -> None:
    predictor = Predictor()
    job = running_job(services, builder, predictor)
    runtime.run_batch(job.job_id, 0, [1])

    runtime.run_batch(job.job_id, 0, [1])

    assert len(predictor.calls) == 1
    assert services.store.state(job.job_id).succeeded == 1


def test_a_try_that_raises_is_retried_and_the_batch_succeeds_on_the_next(
    runtime: WorkerRuntime, services: Services, builder: Builder
) -> None:
    predictor = Predictor(failures=1)
    job = running_job(services, builder, predictor, tries=2)

    runtime.run_batch(job.job_id, 0, [1])

    assert len(predictor.calls) == 2
    assert (services.store.state(job.job_id).succeeded, services.store.failed_batches(job.job_id)) == (1, [])


def test_a_batch_failing_every_try_is_kept_as_failed_with_its_last_error_and_payload(
    runtime: WorkerRuntime, services: Services, builder: Builder
) -> None:
    job = running_job(services, builder, Predictor(failures=3), tries=3)

    runtime.run_batch(job.job_id, 1, [7, 8])

    [failed] = services.store.failed_batches(job.job_id)
    assert (failed["index"], failed["tries"], failed["payload"]) == (1, 3, [7, 8])
    assert "ValueError: bad luck on call 3" in failed["error"]


def test_nothing_of_a_stopped_job_runs(runtime: WorkerRuntime, services: Services, builder: Builder) -> None:
    predictor = Predictor()
    job = running_job(services, builder, predictor)
    services.store.transition(job.job_id, JobStatus.STOPPED)

    runtime.run_batch(job.job_id, 0, [1], delivery=Delivery("node@a", "task-1"))

    assert predictor.calls == []
    assert services.store.recorded_indexes(job.job_id) == set()
    assert services.nodes.inflight("node@a") == {}


def test_a_batch_whose_process_died_more_often_than_its_tries_allow_fails_without_running(
    runtime: WorkerRuntime, services: Services, builder: Builder
) -> None:
    predictor = Predictor()
    job = running_job(services, builder, predictor, tries=1)
    for _ in range(1 + LOST_DELIVERY_ALLOWANCE):  # deliveries whose process died before recording
        services.store.begin_batch(job.job_id, 0)

    runtime.run_batch(job.job_id, 0, [1])

    assert predictor.calls == []
    [failed] = services.store.failed_batches(job.job_id)
    assert failed["error"] == f"the worker process running this batch died {1 + LOST_DELIVERY_ALLOWANCE} times " \
                              "(killed, or out of memory)"


def test_a_batch_carried_by_reference_is_read_from_its_file_and_its_rows_written_as_an_output_part(
    runtime: WorkerRuntime, services: Services, builder: Builder, tmp_path: Path
) -> None:
    source = tmp_path / "input.jsonl"
    source.write_text("1\n2\n3\n")
    predictor = Predictor()
    output = {"path": str(tmp_path / "out"), "format": "jsonl"}
    job = running_job(services, builder, predictor, batches=1, output=output)
    ref = {"uri": str(source), "start": 0, "end": source.stat().st_size, "first_line": 1, "lines": 3}

    runtime.run_batch(job.job_id, 0, None, ref)

    assert predictor.calls[0][0] == [1, 2, 3]
    assert services.store.parts(job.job_id) == {0: 3}
    part = tmp_path / "out" / job.job_id / "part-00000.jsonl"
    assert [json.loads(line) for line in part.read_text().splitlines()] == [2, 4, 6]


def test_a_batch_whose_input_file_vanished_is_failed_naming_the_reading_and_keeps_where_its_items_were(
    runtime: WorkerRuntime, services: Services, builder: Builder, tmp_path: Path
) -> None:
    predictor = Predictor()
    job = running_job(services, builder, predictor, batches=1)
    ref = {"uri": str(tmp_path / "gone.jsonl"), "start": 0, "end": 10, "first_line": 1, "lines": 2}

    runtime.run_batch(job.job_id, 0, None, ref)

    assert predictor.calls == []
    [failed] = services.store.failed_batches(job.job_id)
    assert failed["error"].startswith("reading the batch's input failed: ")
    assert (failed["payload"], failed["payload_ref"]) == (None, ref)


def test_a_batch_of_a_stopped_job_whose_input_vanished_neither_runs_nor_fails(
    runtime: WorkerRuntime, services: Services, builder: Builder, tmp_path: Path
) -> None:
    """Its input is read while its begin is on its way; what the reading found counts only for a batch that runs."""
    predictor = Predictor()
    job = running_job(services, builder, predictor, batches=1)
    services.store.transition(job.job_id, JobStatus.STOPPED)
    ref = {"uri": str(tmp_path / "gone.jsonl"), "start": 0, "end": 10, "first_line": 1, "lines": 2}

    runtime.run_batch(job.job_id, 0, None, ref, delivery=Delivery("node@a", "task-1"))

    assert predictor.calls == [] and services.store.failed_batches(job.job_id) == []
    assert services.store.recorded_indexes(job.job_id) == set()
    assert services.nodes.inflight("node@a") == {}


def test_a_job_whose_predictor_cannot_be_built_fails_and_lets_its_nodes_go(
    runtime: WorkerRuntime, services: Services, builder: Builder, queues: MemoryJobQueues
) -> None:
    job = running_job(services, builder, Predictor())
    builder.errors[job.job_id] = "the model file is corrupt"

    runtime.run_batch(job.job_id, 0, [1])

    state = services.store.state(job.job_id)
    assert (state.status, state.message) == (JobStatus.WORKER_ERROR, "the model file is corrupt")
    assert queues.dropped == [job.queue]
    assert services.store.recorded_indexes(job.job_id) == set()


def test_a_batch_in_flight_enters_its_node_and_leaves_it_once_recorded(
    runtime: WorkerRuntime, services: Services, builder: Builder
) -> None:
    seen: list[dict[str, str]] = []

    class Watching(Predictor):
        def predict(self, payload: Any, batch_id: str) -> list[Any]:
            seen.append(services.nodes.inflight("node@a"))
            return super().predict(payload, batch_id)

    job = running_job(services, builder, Watching())

    runtime.run_batch(job.job_id, 0, [1], delivery=Delivery("node@a", "task-1"))

    assert seen == [{"task-1": f"{job.job_id}:0"}]
    assert services.nodes.inflight("node@a") == {}
