"""A TaskAPI as a user meets it: its cortex.yaml, `POST/GET/DELETE /tasks/<api>` (and `/<api>`), and
its `Task` run once by a worker as its job's one batch.

Fast: the management app and a worker runtime share one set of in-memory services (job store, node
registry, job queues; kombu's in-memory broker). The worker's predictors are real `TaskPredictor`s
built from a project folder written by the test, so the user's `Task` really runs, in the test's
own thread; nothing waits.
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
from flask.testing import FlaskClient

from api import context
from api.app import create_app
from foundation.errors import ConfigError, PredictorError
from foundation.figures import Recorder
from foundation.memory import (
    MemoryAcknowledgements,
    MemoryApiRegistry,
    MemoryFigureStore,
    MemoryIdempotencyKeys,
    MemoryLogStreams,
    MemoryPredictorBuilds,
    MemoryReplicaDirectory,
)
from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.predictors import JobPredictor, JobPredictors
from jobs.nodes.memory import MemoryNodes, MemoryWorkerHosts
from jobs.placement.batch import Placement
from jobs.runner import WorkerRuntime
from jobs.services import Services
from jobs.store.memory import MemoryJobStore
from jobs.tasks import FINISH_JOB, RUN_BATCH
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig, parse_api_configs
from predictors_runtime.task_predictor import TaskPredictor

TASK_API = {"name": "train", "kind": "TaskAPI",
            "definition": {"path": "task.py", "config": {"epochs": 1, "lr": 0.1, "nested": {"a": 1, "b": 2}}}}

TASK_CODE = '''
import json, logging, os

class Task:
    def __call__(self, config):
        logging.getLogger("task").info("training for %s epochs", config["epochs"])
        if config.get("fail"):
            raise ValueError(f"diverged at lr {config['lr']}")
        with open(config["out"], "w") as f:
            json.dump({"config": config, "cwd": os.getcwd(), "secret": os.environ.get("SECRET")}, f)
'''


def _parsed(api: dict[str, Any]) -> ApiConfig:
    return parse_api_configs(json.dumps([api]))[0]


# -- cortex.yaml ----------------------------------------------------------------------------------

def test_a_task_apis_definition_is_read_as_its_code_section() -> None:
    api = _parsed({**TASK_API, "compute": {"gpu": 1}})

    assert (api.kind, api.predictor.path, api.predictor.config["epochs"]) == ("TaskAPI", "task.py", 1)
    assert api.queue == "gpu"
    assert ApiConfig.from_dict(api.to_dict()) == api  # stored and sent to workers unchanged


@pytest.mark.parametrize(("definition", "problem"), [
    ({"path": "task.py", "models": {"path": "m/"}}, "definition.models: unknown field"),
    ({"path": "task.txt"}, "definition.path: must be a .py file"),
    ({"config": {}}, "definition.path: field required"),
    ("task.py", "definition: must be a mapping"),
])
def test_a_bad_definition_is_refused_naming_the_field(definition: Any, problem: str) -> None:
    with pytest.raises(ConfigError) as refused:
        _parsed({"name": "train", "kind": "TaskAPI", "definition": definition})
    assert problem in refused.value.message


def test_a_task_api_takes_a_definition_not_a_predictor() -> None:
    with pytest.raises(ConfigError) as refused:
        _parsed({"name": "train", "kind": "TaskAPI", "predictor": {"path": "task.py"}})
    assert "predictor: unknown field" in refused.value.message
    assert "definition: field required" in refused.value.message


def test_tasks_is_a_reserved_name() -> None:
    with pytest.raises(ConfigError, match="reserved"):
        _parsed({**TASK_API, "name": "tasks"})


# -- the Task itself ------------------------------------------------------------------------------

@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "task.py").write_text(TASK_CODE)
    (folder / ".env").write_text("SECRET=from-dotenv\n")
    return folder


def test_a_task_is_called_with_its_apis_config_merged_with_the_jobs_in_its_project_folder(
    project: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    task = TaskPredictor.build(project, _parsed(TASK_API), {"job_id": "j1"},
                               {"lr": 0.5, "nested": {"b": 3}, "out": str(out)})
    try:
        assert task.predict(None, "batch-0") is None
    finally:
        task.close()

    ran = json.loads(out.read_text())
    assert ran["config"] == {"epochs": 1, "lr": 0.5, "nested": {"a": 1, "b": 3}, "out": str(out)}
    assert (Path(ran["cwd"]), ran["secret"]) == (project, "from-dotenv")


def test_a_project_without_a_task_class_cannot_be_built(project: Path) -> None:
    (project / "task.py").write_text("class PythonPredictor:\n    pass\n")
    with pytest.raises(PredictorError, match="defines no class Task"):
        TaskPredictor.build(project, _parsed(TASK_API), {}, {})


def test_a_task_without_call_cannot_be_built(project: Path) -> None:
    (project / "task.py").write_text("class Task:\n    pass\n")
    with pytest.raises(PredictorError, match=r"__call__\(self, config\)"):
        TaskPredictor.build(project, _parsed(TASK_API), {}, {})


# -- submitted over HTTP, run by a worker ---------------------------------------------------------

class TaskBuilder:
    """Builds each job's `Task` from the test's project folder (a bundle's unpacked folder in production)."""

    def __init__(self, project: Path) -> None:
        self.project = project

    def build(self, job: Job) -> JobPredictor:
        return TaskPredictor.build(self.project, ApiConfig.from_dict(job.api_spec), job.predictor_job_spec(),
                                   job.config)

    def discard(self, job_id: str, job: Job | None) -> None:
        pass


class NoLogStreams:
    def capturing_job(self, job_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capturing_request(self, api_name: str, request_id: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capturing_requests(self, api_name: str, request_ids: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@pytest.fixture
def services(tmp_path: Path) -> Services:
    settings = Settings(storage=str(tmp_path / "storage"), cache_dir=str(tmp_path / "cache"),
                        local_input_roots=(str(tmp_path),))
    celery = Celery("sluice-test", broker="memory://", set_as_current=False)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    store = MemoryJobStore()
    nodes = MemoryNodes(settings.node_ttl_s, inflight=store.inflight)
    queues = MemoryJobQueues()
    return Services(
        settings=settings, celery=celery, redis=redis.Redis(), store=store, nodes=nodes,  # a client never used
        placement=Placement(queues, store, nodes), queues=queues,
        bundles=BundleStore(settings.storage, tmp_path / "cache"), worker_host_store=MemoryWorkerHosts(),
        acks=MemoryAcknowledgements(), idempotency_keys=MemoryIdempotencyKeys(),
    )


@pytest.fixture
def client(services: Services) -> Iterator[FlaskClient]:
    registry = MemoryApiRegistry()
    registry.put(_parsed(TASK_API), "sha256-abc")
    registry.put(ApiConfig.from_dict({"name": "iris", "kind": "BatchAPI", "predictor": {"path": "p.py"}}), "sha256-b")
    figures = MemoryFigureStore()
    app = create_app(services=services, recorder=Recorder(figures))
    app.extensions.update({
        context.REGISTRY: registry, context.PREDICTOR_BUILDS: MemoryPredictorBuilds(),
        context.REPLICAS: MemoryReplicaDirectory(), context.LOG_STREAMS: MemoryLogStreams(),
        context.FIGURE_STORE: figures,
    })
    with app.test_client() as test_client:
        yield test_client
    app.extensions["sluice.figures"].close()


@pytest.fixture
def worker(services: Services, project: Path) -> WorkerRuntime:
    return WorkerRuntime(services, figures=Recorder(MemoryFigureStore()), logs=NoLogStreams(),
                         predictors=JobPredictors(services.store, TaskBuilder(project)))


def queued(services: Services, job_id: str) -> list[tuple[str, list[Any]]]:
    """The tasks waiting on the job's queue, taken off it."""
    with services.celery.connection_for_read() as conn:
        queue = conn.SimpleQueue(f"job.{job_id}")
        try:
            return [(m.headers["task"], m.payload[0]) for m in (queue.get(timeout=1) for _ in range(len(queue)))]
        finally:
            queue.close()


def run_on_worker(worker: WorkerRuntime, services: Services, job_id: str) -> None:
    """What the job's node does: its one batch, then the completion that batch sent."""
    [(name, args)] = queued(services, job_id)
    assert (name, args[:3]) == (RUN_BATCH, [job_id, 0, None])
    worker.run_batch(*args)
    assert queued(services, job_id) == [(FINISH_JOB, [job_id])]
    worker.finish_job(job_id)


def test_a_submitted_task_answers_cortexs_job_spec_and_queues_one_run(client: FlaskClient, services: Services) -> None:
    answer = client.post("/tasks/train", json={"timeout": 600, "config": {"lr": 0.5}})

    assert answer.status_code == 200, answer.get_json()
    spec = answer.get_json()
    assert set(spec) == {"job_id", "api_name", "kind", "workers", "config", "timeout", "created_time"}
    assert (spec["api_name"], spec["kind"], spec["workers"], spec["config"], spec["timeout"]) == (
        "train", "TaskAPI", 1, {"lr": 0.5}, 600)
    [(name, args)] = queued(services, spec["job_id"])
    assert (name, args[:3]) == (RUN_BATCH, [spec["job_id"], 0, None])
    assert services.store.status(spec["job_id"]) is JobStatus.RUNNING


def test_a_task_runs_with_the_merged_config_and_its_job_succeeds(
    client: FlaskClient, services: Services, worker: WorkerRuntime, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    job_id = client.post("/train", json={"config": {"lr": 0.5, "out": str(out)}}).get_json()["job_id"]

    run_on_worker(worker, services, job_id)

    assert json.loads(out.read_text())["config"] == {"epochs": 1, "lr": 0.5, "nested": {"a": 1, "b": 2},
                                                     "out": str(out)}
    read = client.get(f"/train?jobID={job_id}").get_json()
    status = read["job_status"]
    assert (status["status"], status["kind"], status.get("message")) == (
        "status_succeeded", "TaskAPI", None)
    assert status["end_time"] is not None and status["start_time"] == status["created_time"]
    assert read["endpoint"] == "http://localhost/train" and read["api_spec"]["kind"] == "TaskAPI"
    assert "predictor" not in read["api_spec"] and read["api_spec"]["definition"]["path"] == "task.py"
    assert client.get(f"/tasks/train?jobID={job_id}").get_json() == read


def test_a_task_that_raises_ends_its_job_with_a_worker_error_carrying_its_error(
    client: FlaskClient, services: Services, worker: WorkerRuntime, tmp_path: Path
) -> None:
    submitted = client.post("/tasks/train", json={"config": {"fail": True, "out": str(tmp_path / "x")}})
    job_id = submitted.get_json()["job_id"]

    run_on_worker(worker, services, job_id)

    status = client.get(f"/tasks/train?jobID={job_id}").get_json()["job_status"]
    assert status["status"] == "status_worker_error"
    assert "ValueError: diverged at lr 0.1" in status["message"]
    assert status["end_time"] is not None


def test_a_task_job_is_listed_stopped_once_and_then_runs_nothing(
    client: FlaskClient, services: Services, worker: WorkerRuntime, tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    job_id = client.post("/tasks/train", data=b"").get_json()["job_id"]  # an empty body: no options
    assert [job["job_id"] for job in client.get("/tasks/train").get_json()["jobs"]] == [job_id]

    assert client.delete(f"/train?jobID={job_id}").get_json() == {"message": f"stopped job {job_id}"}
    assert client.delete(f"/tasks/train?jobID={job_id}").status_code == 409
    for _, args in queued(services, job_id):
        worker.run_batch(*args)

    assert not out.exists()
    assert client.get(f"/tasks/train?jobID={job_id}").get_json()["job_status"]["status"] == "status_stopped"


@pytest.mark.parametrize(("body", "field"), [
    ({"timeout": 0}, "timeout: must be from 1 to"),
    ({"timeout": "soon"}, "timeout:"),
    ({"config": [1, 2]}, "config:"),
    ({"workers": 2}, "workers: unknown field"),
    ([1], "must be a JSON object"),
])
def test_a_bad_task_submission_is_a_400_naming_the_field_and_creates_nothing(
    client: FlaskClient, services: Services, body: Any, field: str
) -> None:
    answer = client.post("/tasks/train", json=body)

    assert answer.status_code == 400
    assert (answer.get_json()["kind"], field in answer.get_json()["message"]) == ("bad_request", True)
    assert services.store.list_ids("train") == []


def test_unknown_apis_jobs_and_apis_of_another_kind_are_404s(client: FlaskClient) -> None:
    assert client.post("/tasks/nope", json={}).get_json()["kind"] == "api_not_found"
    assert client.post("/tasks/iris", json={}).status_code == 404  # a BatchAPI runs no tasks
    assert client.post("/batch/train", json={"item_list": {"items": [1], "batch_size": 1}}).status_code == 404
    assert client.get("/tasks/train?jobID=0123456789abcdef0000").get_json()["kind"] == "job_not_found"
