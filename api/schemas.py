"""The bodies the management API answers with, and the query parameters it reads, as pydantic models.

`api/openapi.py` builds `GET /openapi.json` from these models (and from the request models that
validate bodies: `jobs.batch.submission.JobRequest`, `predictors_runtime.config.ApiConfig`), and the
handlers produce their JSON through them, so the document and the answers cannot drift apart: a
field added to an answer but not here is refused (`extra="forbid"`) the first time a test runs
that handler.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from flask import Response, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import JsonDict

from foundation.errors import BadRequest
from foundation.log_streams import DEFAULT_PAGE_LINES, MAX_PAGE_LINES
from jobs.batch.job import JobStatus
from predictors_runtime.config import ApiConfig
from predictors_runtime.splitter_config import TrafficSplitterConfig

# The input sources of jobs.batch.submission.SOURCES (a unit test keeps the two the same).
Source = Literal["item_list", "file_path_lister", "delimited_files", "retry_failed_of"]

_RFC3339: JsonDict = {"format": "date-time"}


class Body(BaseModel):
    """An answer's body: unknown fields are refused, and fields left unset are left out of the JSON.

    Optional fields default to None and are absent from the answer unless a handler set them
    (`exclude_unset`), which is how the answers have always looked; a field set to None is sent
    as null.
    """

    model_config = ConfigDict(extra="forbid")

    def response(self, status: int = 200) -> Response:
        answer = jsonify(self.model_dump(mode="json", exclude_unset=True))
        answer.status_code = status
        return answer


# -- errors -------------------------------------------------------------------------------------

class Error(Body):
    """Every error of the management API (`api/errors.py`)."""

    kind: str = Field(description="what went wrong, as a stable word: bad_request, api_not_found, job_not_found, "
                                  "invalid_config, conflict, payload_too_large, unauthorized, not_ready, ...")
    message: str = Field(description="what went wrong, for people: names the field, limit or object")


class RealtimeError(Body):
    """Every error of a realtime API, from its replicas, the proxy or the management API's fallback."""

    kind: str = Field(description=(
        "bad_request, invalid_model_input, api_not_found, model_not_found, payload_too_large, predictor_error, "
        "not_ready, overloaded, request_timeout, bad_gateway, method_not_allowed, unexpected_error"))
    message: str
    request_id: str | None = Field(default=None, description="the request's id, as in its X-Request-ID header")


# -- AsyncAPI requests -------------------------------------------------------------------------

class AsyncSubmitted(Body):
    """An AsyncAPI request as stored: fetch its status and result with GET /{api_name}/{request_id}."""

    id: str = Field(description="the request's id: the client's X-Request-ID when valid, else a new one")


class AsyncRequestStatus(Body):
    """An AsyncAPI request's status (Cortex's), with its result once completed."""

    id: str
    status: Literal["in_queue", "in_progress", "completed", "failed"]
    result: Any = Field(default=None, description="what predict returned (JSON); only once completed")
    timestamp: float | None = Field(default=None, description="when it completed or failed (epoch seconds)")
    message: str | None = Field(default=None, description="why it failed (one line); only once failed")


# -- batch jobs ---------------------------------------------------------------------------------

class OutputLocation(Body):
    path: str
    format: Literal["jsonl", "parquet", "csv"]


class JobSpec(Body):
    """A job as submitted (`Job.spec()`): the answer to a submission, and the start of its status."""

    job_id: str
    api_name: str
    kind: Literal["BatchAPI"]
    workers: int
    config: dict[str, Any]
    timeout: int | None
    total_batch_count: int = Field(description="0 until JSON-lines input has been split into batches")
    start_time: str = Field(json_schema_extra=_RFC3339)
    output: OutputLocation | None = None
    batch_timeout: float | None = None
    retry_failed_of: str | None = None


class DryRun(Body):
    """The answer to `POST /batch/<api>?dryRun=true`: the submission checked, nothing enqueued."""

    dry_run: Literal[True]
    validation: Literal["passed"]
    source: Source
    files: list[str]
    total_batch_count: int | None


class BatchMetrics(Body):
    succeeded: int
    failed: int
    average_time_per_batch: float | None


class WorkerCounts(Body):
    pending: int
    running: int
    succeeded: int
    failed: int


class JobStatusView(JobSpec):
    """A job's progress (`jobs.batch.status.job_status_view`)."""

    status: JobStatus
    batches_in_queue: int
    batch_metrics: BatchMetrics
    worker_counts: WorkerCounts
    end_time: str | None = Field(json_schema_extra=_RFC3339)
    message: str | None = None
    phase: str | None = Field(default=None, description="while the job is active: what it is doing, in words "
                                                        "(enqueuing batches, waiting for worker nodes, building the "
                                                        "predictor on a node, running)")
    workers_note: str | None = Field(default=None, description="while the job runs on fewer nodes than its `workers`: "
                                                               "why (nodes starting, or no host with room)")


class JobStatusAnswer(Body):
    """`GET /batch/<api>?jobID=...`, as Cortex answered it."""

    job_status: JobStatusView
    endpoint: str = Field(description="the API's endpoint, <address>/<api>, where jobs are submitted and read")
    api_spec: ApiConfig


class JobList(Body):
    """`GET /batch/<api>`: the API's jobs, newest first."""

    jobs: list[JobStatusView]


class Stopped(Body):
    message: str


# -- task jobs ----------------------------------------------------------------------------------

class TaskJobSpec(Body):
    """A TaskAPI's job as submitted (`Job.spec()` of a task), as Cortex answered a task submission."""

    job_id: str
    api_name: str
    kind: Literal["TaskAPI"]
    workers: Literal[1] = Field(description="a task runs once, on one worker node")
    config: dict[str, Any] = Field(description="the job's config, merged over the API's definition.config")
    timeout: int | None = Field(description="seconds from submission before the job is timed out; null: none")
    created_time: str = Field(json_schema_extra=_RFC3339)


class TaskJobStatusView(TaskJobSpec):
    """A task job's progress (`jobs.batch.status.task_status_view`)."""

    status: JobStatus
    start_time: str = Field(json_schema_extra=_RFC3339)
    end_time: str | None = Field(json_schema_extra=_RFC3339)
    worker_counts: WorkerCounts
    message: str | None = Field(default=None, description="why the job ended as it did: a failed task's error, "
                                                          "a timeout, a stop")


class TaskJobStatusAnswer(Body):
    """`GET /tasks/<api>?jobID=...` (and `GET /<api>?jobID=...`), as Cortex answered it."""

    job_status: TaskJobStatusView
    endpoint: str = Field(description="the API's endpoint, <address>/<api>, where tasks are submitted and read")
    api_spec: dict[str, Any] = Field(description="the API as deployed, its code section under `definition` as in "
                                                 "Cortex's cortex.yaml")


class TaskJobList(Body):
    """`GET /tasks/<api>`: the API's task jobs, newest first."""

    jobs: list[TaskJobStatusView]


class FailedBatch(Body):
    """A batch that failed after all its tries, kept for inspection."""

    index: int
    error: str
    tries: int
    payload: Any = Field(description="the batch's items, or null when they live elsewhere (see payload_ref)")
    payload_ref: dict[str, Any] | None = None


class FailedBatches(Body):
    job_id: str
    failed_batches: list[FailedBatch]


# -- APIs ---------------------------------------------------------------------------------------

class Replica(Body):
    """A live replica of a realtime API, on any host."""

    id: str
    address: str = Field(description="host:port the proxy reaches it at")
    ready: bool
    draining: bool = Field(description="being replaced or stopped: gets no new requests")
    bundle: str = Field(description="the deployment it serves")
    message: str = Field(description="why it is not ready, if known: a step of its start, or a failure")
    failing: bool = Field(description="its message is a failure (a predictor or environment that failed to build, "
                                      "a server that exited), not a step of its start")
    last_oom_at: float | None = Field(default=None, description="when a process of it was last stopped for memory "
                                      "(past its API's compute.mem); null if never")
    last_oom: str | None = Field(default=None, description="what its launcher said of that stop: the limit and the "
                                 "peak")
    devices: str | None = Field(default=None, description="the GPUs its processes see (CUDA_VISIBLE_DEVICES), "
                                "its own on its host; null when it has none")


class AsyncRequestCounts(Body):
    """An AsyncAPI's requests now, and those ended in the last minute (to the last 10 seconds)."""

    in_queue: int = Field(ge=0, description="waiting for a worker node")
    in_progress: int = Field(ge=0, description="running on a worker node")
    completed_per_minute: int = Field(ge=0, description="completed in the last minute")
    failed_per_minute: int = Field(ge=0, description="failed in the last minute")


class AsyncScaling(Body):
    """How many worker nodes an AsyncAPI's scaler wants, how many serve it, and on what it decided."""

    desired: int = Field(ge=0, description="nodes its scaler wants (between min_replicas and max_replicas)")
    ready: int = Field(ge=0, description="live nodes placed on it")
    pending: int = Field(ge=0, description="nodes wanted that no live node of its hardware queue is free for")
    in_flight: float = Field(ge=0, description="requests queued and running that the last decision saw")


class HostReplicas(Body):
    """One replica host's share of a RealtimeAPI."""

    desired: int = Field(ge=0, description="replicas placement assigned to this host")
    ready: int = Field(ge=0, description="of them, live and serving (every process ready, not draining)")


class RealtimeScaling(Body):
    """How many replicas a RealtimeAPI's scaler wants, where placement put them, how many serve, and
    the in-flight figure the scaler decided on."""

    desired: int = Field(ge=0, description="replicas wanted: the scaler's last decision, else init_replicas")
    ready: int = Field(ge=0, description="replicas live and serving, on every host")
    starting: int = Field(ge=0, description="replicas placed on a host and not ready yet")
    pending: int = Field(ge=0, description="replicas wanted that no live host has room for")
    pending_reason: str | None = Field(default=None, description="present while some are pending: why "
                                       "(\"no host has 1 gpu free\")")
    in_flight: float = Field(ge=0, description="requests queued at the proxies and running, averaged over the "
                             "window, that the scaler's last decision saw (0 before its first)")
    hosts: dict[str, HostReplicas] = Field(description="placement host id -> its replicas of this API")


class BuildError(Body):
    """Why a worker node could not build an API's predictor."""

    bundle: str
    message: str
    at: float


class EnvironmentOnHost(Body):
    """One host's build of an API's environment."""

    state: Literal["building", "ready", "failed"]
    seconds: float | None = Field(default=None, description="how long the build took (ready)")
    error: str | None = Field(default=None, description="what failed, in the installer's words (failed)")
    at: float | None = None


class ApiEnvironment(Body):
    """An API's environment: what it resolved to at deploy and, in GET /apis/{name}, how it fares on each host."""

    key: str = Field(description="the hash every host keeps the environment under")
    python: str
    platform: str
    packages: dict[str, str] = Field(description="package -> the version locked at deploy")
    requirements: str | None = Field(default=None, description="the requirements file installed")
    shell: str | None = Field(default=None, description="the dependencies.sh run before the requirements")
    moved: list[str] | None = Field(default=None, description="the pins a deploy with nearest_wheels moved, each "
                                    "`old -> new: why`")
    state: Literal["locked", "building", "ready", "failed"] | None = Field(
        default=None, description="in GET /apis/{name}: locked (built on no host yet), building, ready, failed")
    error: str | None = Field(default=None, description="in GET /apis/{name}: why a host could not build it")
    hosts: dict[str, EnvironmentOnHost] | None = Field(default=None, description="in GET /apis/{name}: host -> state")


class SplitShare(Body):
    """One API a TrafficSplitter shares requests with, and how many it was sent."""

    api: str
    weight: int = Field(description="percent of the splitter's requests it answers; for the shadow, percent copied")
    shadow: bool = Field(description="gets a copy of requests; its answers are dropped")
    sent: int = Field(description="requests the proxies sent it through the splitter since the splitter was deployed")
    share: float | None = Field(description="its part of the requests answered through the splitter (the shadow: "
                                "copies per request); null before the first")
    state: str = Field(description="ready (a replica answers), not_ready, or missing (not a deployed RealtimeAPI)")


class Api(Body):
    """A deployed API; `GET /apis/<name>` adds its endpoint, for a realtime API its live replicas and
    scaling, for an AsyncAPI its request counts, serving nodes and scaling, and for a TrafficSplitter
    what each of its APIs was sent."""

    name: str
    kind: Literal["BatchAPI", "RealtimeAPI", "TaskAPI", "AsyncAPI", "TrafficSplitter"]
    bundle: str
    queue: Literal["cpu", "gpu", "inf"]
    deployed_at: float
    ignored_fields: list[str]
    spec: ApiConfig | TrafficSplitterConfig
    split: list[SplitShare] | None = Field(default=None, description="TrafficSplitter only, in GET /apis/{name}")
    endpoint: str | None = Field(default=None, description="in GET /apis/{name}: the URL of /<name> at the "
                                 "address the request came to (a BatchAPI's or TaskAPI's job endpoint, a "
                                 "RealtimeAPI's predictions)")
    replicas: list[Replica] | None = Field(default=None, description="RealtimeAPI only, in GET /apis/{name}")
    requests: AsyncRequestCounts | None = Field(default=None, description="AsyncAPI only, in GET /apis/{name}")
    nodes: list[str] | None = Field(default=None, description="AsyncAPI only, in GET /apis/{name}: the live "
                                    "worker nodes placed on it, which run its requests")
    scaling: RealtimeScaling | AsyncScaling | None = Field(
        default=None, description="RealtimeAPI and AsyncAPI, in GET /apis/{name}: a RealtimeAPI's has `hosts`")
    build_error: BuildError | None = Field(
        default=None, description="in GET /apis/{name}: the last failed build of its predictor on a worker node "
        "(gone once a build succeeds or the API is deployed again)")
    environment: ApiEnvironment | None = Field(
        default=None, description="the API's own Python environment (its project's requirements.txt and "
        "dependencies.sh, locked at deploy); null when it runs in Sluice's own")
    warnings: list[str] | None = Field(
        default=None, description="in the answer to a deploy: what will likely fail later, e.g. a module the "
        "predictor imports that its environment will not have")


class ApiList(Body):
    apis: list[Api]


class Deleted(Body):
    message: str
    stopped_jobs: list[str]


# -- management -------------------------------------------------------------------------------

class Health(Body):
    status: Literal["ok"]
    worker_nodes: dict[str, list[str]] = Field(description="live worker node -> hardware queues it consumes")


# -- realtime -----------------------------------------------------------------------------------

class ModelVersions(Body):
    name: str
    versions: list[int]


class Readiness(Body):
    """`GET /<api>` of a ready realtime API: the model versions it serves."""

    ready: Literal[True]
    models: list[ModelVersions]


class LogPage(Body):
    lines: list[dict[str, Any]] = Field(description="JSON log lines, oldest first, as the processes logged them")
    next: str = Field(description="the position to pass back as `after` for newer lines only")


# -- query parameters ---------------------------------------------------------------------------

class Query(BaseModel):
    """Query parameters of one operation; unknown ones are ignored, as HTTP APIs usually do."""

    model_config = ConfigDict(extra="ignore")


class SubmitQuery(Query):
    dryRun: bool = Field(default=False, description="check the submission (and list its input files) without "
                                                    "enqueuing anything")


# Jobs `GET /batch/<api>` lists at most (the bound also keeps the number within what Redis takes).
MAX_LIST_LIMIT = 1000


class JobsQuery(Query):
    jobID: str | None = Field(default=None, min_length=1, description="a job's id: answer that job's status "
                                                                       "instead of the list")
    limit: int = Field(default=100, ge=1, le=MAX_LIST_LIMIT, description="jobs listed at most, newest first")


class JobQuery(Query):
    jobID: str = Field(min_length=1, description="the job's id, as its submission answered")


class LogsQuery(Query):
    after: str | None = Field(default=None, min_length=1, description="a position as a page's `next` gave it "
                                                                      "(such as 1700000000000-0): only newer lines")
    limit: int = Field(default=DEFAULT_PAGE_LINES, ge=1, le=MAX_PAGE_LINES, description="lines answered at most")


class DeleteApiQuery(Query):
    force: bool = Field(default=False, description="stop the API's running jobs first instead of refusing")


Q = TypeVar("Q", bound=Query)


def _expected(model: type[Query], name: str) -> str:
    """What a parameter must be, read back from its declaration (`ge`, `le`, its type)."""
    schema = model.model_json_schema()["properties"].get(name, {})
    kinds = {option.get("type") for option in schema.get("anyOf", [schema])}
    if "integer" in kinds:
        return f"must be an integer from {schema.get('minimum')} to {schema.get('maximum')}"
    if "boolean" in kinds:
        return "must be true or false"
    return "must not be empty"


def parse_query(model: type[Q]) -> Q:
    """The request's query parameters, validated; a `BadRequest` naming the parameter otherwise."""
    try:
        return model.model_validate(request.args.to_dict(flat=True))
    except ValidationError as e:
        problems = []
        for error in e.errors():
            name = ".".join(str(part) for part in error["loc"])
            if error["type"] == "missing":
                problems.append(f"query parameter {name} is required")
            else:
                got = str(error.get("input"))[:40]
                problems.append(f"query parameter {name} {_expected(model, name)} (got {got!r})")
        raise BadRequest("; ".join(problems)) from e
