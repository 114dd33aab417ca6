"""The OpenAPI document of Sluice's HTTP API (`GET /openapi.json`): what its public address answers.

Built, not written: the paths are the Flask app's own routes (its `url_map`), each operation's
words come from `OPERATIONS` below, and every body schema is generated from the pydantic models
that validate the requests (`jobs.batch.submission.JobRequest`, `jobs.batch.taskapi_jobs.TaskRequest`,
`predictors_runtime.config.ApiConfig`) or build the answers (`api/schemas.py`). A route without an
entry in `OPERATIONS` still appears, marked `x-undocumented`, and fails `tests/unit/test_openapi.py`
until it is described.

The management paths are served by the management API; `/{api_name}` of a realtime API by its
replicas (or, while none is ready, by the management API's fallback, with the same error shape).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from flask import Flask
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from foundation.version import sluice_version
from jobs.batch.submission import SOURCES, JobRequest
from jobs.batch.taskapi_jobs import TaskRequest
from predictors_runtime.config import ApiConfig

from . import schemas
from .schemas import Query

OPENAPI_VERSION = "3.1.0"
SCHEMAS = "#/components/schemas/"
# Methods Flask adds to every route by itself.
IMPLICIT_METHODS = frozenset({"HEAD", "OPTIONS"})

Mode = Literal["validation", "serialization"]


@dataclass(frozen=True)
class Answer:
    """One response of an operation: a JSON body of one of `models`, or the given `content`."""

    description: str
    models: tuple[type[BaseModel], ...] = ()
    content: dict[str, Any] | None = None
    headers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    """What the document says of one (method, Flask rule) beyond what the route itself tells."""

    operation_id: str
    summary: str
    answers: dict[int, Answer]
    description: str = ""
    query: type[Query] | None = None
    request_body: dict[str, Any] | None = None  # its schemas may name models as {"model": M}
    header_parameters: tuple[dict[str, Any], ...] = ()
    links: dict[int, dict[str, Any]] = field(default_factory=dict)
    open: bool = False  # answered without an API key
    realtime: bool = False  # served by the API's replicas: answers carry X-Request-ID


def _error(description: str, model: type[BaseModel] = schemas.Error, **headers: Any) -> Answer:
    return Answer(description, (model,), headers=headers)


def _json(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": {"model": model}}}}


# -- the path parameters of the Flask rules -----------------------------------------------------

PATH_PARAMETERS: dict[str, str] = {
    "api_name": "the API's name, as its cortex.yaml gives it",
    "name": "the API's name, as its cortex.yaml gives it",
    "job_id": "the job's id, as its submission answered",
    "request_id": "an AsyncAPI request's id, as its submission answered",
    "filename": "a file's name",
}

# -- every operation ----------------------------------------------------------------------------

_REQUEST_ID_HEADER = {"description": "the request's id: the client's own X-Request-ID, or a new one",
                      "schema": {"type": "string"}}
_REQUEST_ID_PARAMETER = {
    "name": "X-Request-ID", "in": "header", "required": False, "schema": {"type": "string"},
    "description": "kept as the request's id (in logs and the answer); the proxy makes one up when absent",
}
_IDEMPOTENCY_PARAMETER = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,255}$"},
    "description": "the same key within a day gives the same job (answered with Idempotent-Replayed: true)",
}
_UNACKNOWLEDGED = ("not_acknowledged: Redis took the write but its replicas did not confirm it within "
                   "SLUICE_ACK_TIMEOUT_MS; it may or may not have taken (a keyed submission gets Retry-After)")
_BINARY = {"type": "string", "format": "binary"}
_JOB_LINKS = {
    "GetJobStatus": {"operationId": "getJobs",
                     "parameters": {"api_name": "$request.path.api_name", "jobID": "$response.body#/job_id"}},
    "GetFailedBatches": {"operationId": "getFailedBatches",
                         "parameters": {"api_name": "$request.path.api_name", "jobID": "$response.body#/job_id"}},
    "StopJob": {"operationId": "stopJob",
                "parameters": {"api_name": "$request.path.api_name", "jobID": "$response.body#/job_id"}},
}
_NOT_DEPLOYED = "api_not_found: no API of that name is deployed, or it is not a BatchAPI"
_NO_JOB = _NOT_DEPLOYED + "; job_not_found: no job of that id in this API"
_NO_TASK_API = "api_not_found: no API of that name is deployed, or it is not a TaskAPI"
_NO_TASK_JOB = _NO_TASK_API + "; job_not_found: no job of that id in this API"
_TASK_LINKS = {
    "GetTaskJobStatus": {"operationId": "getTaskJobs",
                         "parameters": {"api_name": "$request.path.api_name", "jobID": "$response.body#/job_id"}},
    "StopTaskJob": {"operationId": "stopTaskJob",
                    "parameters": {"api_name": "$request.path.api_name", "jobID": "$response.body#/job_id"}},
}

OPERATIONS: dict[tuple[str, str], Operation] = {
    ("GET", "/healthz"): Operation(
        "getHealth", "Liveness and readiness",
        {200: Answer("Redis answers; the live worker nodes and the queues they consume", (schemas.Health,)),
         503: _error("not_ready: Redis cannot be reached")},
        open=True,
    ),
    ("GET", "/metrics"): Operation(
        "getMetrics", "Prometheus metrics",
        {200: Answer("metrics in Prometheus' text format", content={"text/plain": {"schema": {"type": "string"}}})},
    ),
    ("GET", "/openapi.json"): Operation(
        "getOpenApi", "This document",
        {200: Answer("the OpenAPI document", content={"application/json": {"schema": {"type": "object"}}})},
        open=True,
    ),
    ("GET", "/"): Operation(
        "getFrontPage", "A page for a browser: the deployed APIs and their links",
        {200: Answer("an HTML page", content={"text/html": {"schema": {"type": "string"}}})},
    ),
    ("GET", "/docs"): Operation(
        "getDocs", "This document in Swagger UI",
        {200: Answer("an HTML page that renders /openapi.json", content={"text/html": {"schema": {"type": "string"}}})},
        open=True,
    ),
    ("GET", "/docs/assets/<filename>"): Operation(
        "getDocsAsset", "One of Swagger UI's files, for /docs",
        {200: Answer("the file", content={"*/*": {"schema": _BINARY}}),
         404: Answer("no such file")},
        open=True,
    ),
    ("POST", "/apis"): Operation(
        "deployApis", "Deploy a project: every API of its cortex.yaml",
        {201: Answer("the APIs deployed", (schemas.ApiList,)),
         400: _error("bad_request (a multipart field missing, a project archive that does not unpack) or "
                     "invalid_config (the cortex.yaml: the message names the field)"),
         413: _error("payload_too_large: the project is larger than the limit")},
        description="What `sluice deploy` sends. A redeploy replaces the API; running jobs keep the code "
                    "they started with.",
        request_body={"required": True, "content": {"multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {
                    "config": {**_BINARY,
                               "description": "the cortex.yaml: a YAML list of APIs, each an ApiConfig-Input "
                                                         "(#/components/schemas/ApiConfig-Input)"},
                    "project": {**_BINARY,
                                "description": "the project folder as a gzipped tar (`sluice deploy` packs it)"},
                    "nearest_wheels": {"type": "string", "enum": ["0", "1"],
                                       "description": "1: move an exact pin with no wheel for this Python to the "
                                                      "oldest release that has one, and a pin of a library Sluice "
                                                      "runs on to Sluice's version (`sluice deploy --nearest-wheels`)"},
                },
                "required": ["config", "project"],
            },
            "encoding": {"config": {"contentType": "application/yaml, text/plain, application/octet-stream"},
                         "project": {"contentType": "application/gzip, application/octet-stream"}},
        }}},
    ),
    ("GET", "/apis"): Operation(
        "listApis", "Deployed APIs, by name",
        {200: Answer("every deployed API", (schemas.ApiList,))},
    ),
    ("GET", "/apis/<name>"): Operation(
        "getApi", "One API; a realtime API's answer also lists its live replicas, an AsyncAPI's its request "
        "counts and serving nodes",
        {200: Answer("the API", (schemas.Api,)), 404: _error("api_not_found")},
    ),
    ("DELETE", "/apis/<name>"): Operation(
        "deleteApi", "Delete an API",
        {200: Answer("deleted, with the jobs stopped on the way", (schemas.Deleted,)),
         400: _error("bad_request: a query parameter of the wrong type"),
         404: _error("api_not_found"),
         409: _error("conflict: jobs of the API are running and force is not set")},
        description="A realtime API's replicas stop once they see it gone.",
        query=schemas.DeleteApiQuery,
    ),
    ("POST", "/batch/<api_name>"): Operation(
        "submitJob", "Submit a batch job",
        {200: Answer("the job as submitted, or with dryRun the checked submission", (schemas.JobSpec, schemas.DryRun)),
         400: _error("bad_request: the body is not a valid submission (the message names the field)"),
         403: _error("access_denied: the job's input or output storage refused access"),
         404: _error(_NOT_DEPLOYED + "; storage_not_found or job_not_found: an input (or the job of "
                     "retry_failed_of) does not exist"),
         409: _error("conflict: the job of retry_failed_of is still running, or a submission with the same "
                     "Idempotency-Key is being made"),
         413: _error("payload_too_large: the body is larger than SLUICE_MAX_BODY_BYTES"),
         502: _error("storage_error: the input storage could not be listed")},
        description="Exactly one input source (item_list, file_path_lister, delimited_files or retry_failed_of).",
        query=schemas.SubmitQuery,
        header_parameters=(_IDEMPOTENCY_PARAMETER,),
        request_body=_json(JobRequest),
        links={200: _JOB_LINKS},
    ),
    ("GET", "/batch/<api_name>"): Operation(
        "getJobs", "A job's status (with jobID) or the API's jobs, newest first",
        {200: Answer("with jobID, the job's status; without, the API's jobs",
                     (schemas.JobStatusAnswer, schemas.JobList)),
         400: _error("bad_request: a query parameter out of range"),
         404: _error(_NO_JOB)},
        query=schemas.JobsQuery,
    ),
    ("DELETE", "/batch/<api_name>"): Operation(
        "stopJob", "Stop a job",
        {200: Answer("stopped: no new batch starts; running ones finish", (schemas.Stopped,)),
         400: _error("bad_request: jobID is missing"),
         404: _error(_NO_JOB),
         409: _error("conflict: the job has already ended")},
        query=schemas.JobQuery,
    ),
    ("GET", "/batch/<api_name>/failed"): Operation(
        "getFailedBatches", "Failed batches of a job, with their errors and payloads",
        {200: Answer("the batches that failed after all their tries", (schemas.FailedBatches,)),
         400: _error("bad_request: jobID is missing"),
         404: _error(_NO_JOB)},
        query=schemas.JobQuery,
    ),
    ("GET", "/batch/<api_name>/<job_id>/logs"): Operation(
        "getJobLogs", "A job's log lines from every worker on every host, oldest first",
        {200: Answer("a page of lines; pass its next back as after for newer ones", (schemas.LogPage,)),
         400: _error("bad_request: after is not a position a page gave, or limit is out of range"),
         404: _error(_NO_JOB)},
        description="The lines the job's predictor and Sluice logged while running its batches and its "
                    "on_job_complete; the stream keeps about the newest SLUICE_LOG_LINES.",
        query=schemas.LogsQuery,
    ),
    ("POST", "/tasks/<api_name>"): Operation(
        "submitTaskJob", "Run a TaskAPI's Task once, as a job",
        {200: Answer("the job as submitted", (schemas.TaskJobSpec,)),
         400: _error("bad_request: the body is not a valid task submission (the message names the field)"),
         404: _error(_NO_TASK_API),
         409: _error("conflict: a submission with the same Idempotency-Key is being made"),
         413: _error("payload_too_large: the body is larger than SLUICE_MAX_BODY_BYTES")},
        header_parameters=(_IDEMPOTENCY_PARAMETER,),
        description="Task()(config) runs once on one worker node of the API's hardware queue; config is the "
                    "API's definition.config merged with the body's (the body's keys win). An empty body is a "
                    "task with no options.",
        request_body={**_json(TaskRequest), "required": False},
        links={200: _TASK_LINKS},
    ),
    ("GET", "/tasks/<api_name>"): Operation(
        "getTaskJobs", "A task job's status (with jobID) or the API's task jobs, newest first",
        {200: Answer("with jobID, the job's status; without, the API's jobs",
                     (schemas.TaskJobStatusAnswer, schemas.TaskJobList)),
         400: _error("bad_request: a query parameter out of range"),
         404: _error(_NO_TASK_JOB)},
        query=schemas.JobsQuery,
    ),
    ("DELETE", "/tasks/<api_name>"): Operation(
        "stopTaskJob", "Stop a task job",
        {200: Answer("stopped: the worker node running the task ends it", (schemas.Stopped,)),
         400: _error("bad_request: jobID is missing"),
         404: _error(_NO_TASK_JOB),
         409: _error("conflict: the job has already ended")},
        query=schemas.JobQuery,
    ),
    ("GET", "/tasks/<api_name>/<job_id>/logs"): Operation(
        "getTaskJobLogs", "A task job's log lines, oldest first",
        {200: Answer("a page of lines; pass its next back as after for newer ones", (schemas.LogPage,)),
         400: _error("bad_request: after is not a position a page gave, or limit is out of range"),
         404: _error("api_not_found or job_not_found")},
        description="The lines the job's Task and Sluice logged while it ran (as /batch/{api_name}/{job_id}/logs).",
        query=schemas.LogsQuery,
    ),
    ("GET", "/apis/<api_name>/logs"): Operation(
        "getApiLogs", "A realtime API's or an AsyncAPI's recent log lines, from every replica or node",
        {200: Answer("a page of lines; pass its next back as after for newer ones", (schemas.LogPage,)),
         400: _error("bad_request: after is not a position a page gave, limit is out of range, or the API is a "
                     "BatchAPI or TaskAPI (whose logs are per job)"),
         404: _error("api_not_found")},
        description="A RealtimeAPI's lines from every process of its replicas; an AsyncAPI's from every worker "
                    "node while it ran the API's requests (one request's: /apis/{api_name}/requests/{request_id}"
                    "/logs).",
        query=schemas.LogsQuery,
    ),
    ("GET", "/apis/<api_name>/requests/<request_id>/logs"): Operation(
        "getAsyncRequestLogs", "An AsyncAPI request's log lines, oldest first",
        {200: Answer("a page of lines; pass its next back as after for newer ones", (schemas.LogPage,)),
         400: _error("bad_request: after is not a position a page gave, limit is out of range, or the API is "
                     "not an AsyncAPI"),
         404: _error("api_not_found, or request_not_found (never submitted, or expired)")},
        description="The lines the worker node logged while it ran the request, its predictor's included; "
                    "with server_side_batching, every line of the batch's predict call is in each of its "
                    "requests' logs.",
        query=schemas.LogsQuery,
    ),
    ("GET", "/<api_name>"): Operation(
        "getAtApiPath", "Readiness of a realtime API; a batch or task API's job status or jobs",
        {200: Answer("a RealtimeAPI: ready, with the model versions being served; a BatchAPI: as GET "
                     "/batch/{api_name}; a TaskAPI: as GET /tasks/{api_name}",
                     (schemas.Readiness, schemas.JobStatusAnswer, schemas.JobList, schemas.TaskJobStatusAnswer,
                      schemas.TaskJobList)),
         400: _error("bad_request (a BatchAPI's query parameter out of range)"),
         404: _error("api_not_found (not deployed), model_not_found, or job_not_found (a BatchAPI's jobID)",
                     schemas.RealtimeError),
         503: _error("not_ready: no replica is ready yet; the message says why", schemas.RealtimeError)},
        description="A RealtimeAPI: 200 once a replica of the API has built its predictor and loaded its "
                    "models; its replicas take no query parameters. A BatchAPI (Cortex's endpoint): with "
                    "the query parameter jobID the job's status, without it the API's jobs (limit: how "
                    "many, 1-1000), as GET /batch/{api_name}; it wants the API key whenever keys are set. A "
                    "TaskAPI likewise, as GET /tasks/{api_name}.",
        header_parameters=(_REQUEST_ID_PARAMETER,),
        realtime=True,
    ),
    ("POST", "/<api_name>"): Operation(
        "predictOrSubmitJob", ("A RealtimeAPI's predict(payload, query_params, headers); a BatchAPI's or "
                               "TaskAPI's job submission; an AsyncAPI's request"),
        {200: Answer("what predict returned; for a BatchAPI the job as submitted (as POST /batch/{api_name}); for "
                     "a TaskAPI as POST /tasks/{api_name}; for an AsyncAPI {\"id\"} (AsyncSubmitted), its result "
                     "fetched with GET /{api_name}/{request_id}",
                     content={
            "application/json": {"schema": {}},
            "text/plain": {"schema": {"type": "string"}},
            "application/octet-stream": {"schema": _BINARY},
        }),
         400: _error("bad_request (a body that does not parse) or invalid_model_input (a model input of the "
                     "wrong name, shape or type)", schemas.RealtimeError),
         404: _error("api_not_found (not deployed, or a BatchAPI) or model_not_found (an unknown model name "
                     "or version)", schemas.RealtimeError),
         413: _error("payload_too_large", schemas.RealtimeError),
         500: _error("predictor_error: predict raised, or returned what cannot be sent", schemas.RealtimeError),
         503: _error("not_ready (no replica is ready yet; the message says why) or overloaded (every replica "
                     "busy and its queue full: retry after Retry-After seconds)", schemas.RealtimeError,
                     **{"Retry-After": {"description": "with kind overloaded: seconds after which to try again",
                                        "schema": {"type": "integer"}}}),
         504: _error("request_timeout: the API's request_timeout ran out while the request waited or ran",
                     schemas.RealtimeError)},
        description=(
            "A RealtimeAPI: the payload predict receives depends on the Content-Type: parsed JSON, a "
            "read-only mapping of form fields and files, decoded text, or the body's bytes for any other "
            "type. The answer is JSON for a JSON-able result, text/plain for a str, "
            "application/octet-stream for bytes, or whatever response the predictor built. A BatchAPI "
            "(Cortex's endpoint): a job submission, with the body, query and answers of POST "
            "/batch/{api_name}; it wants the API key whenever keys are set. A TaskAPI: a task submission, as "
            "POST /tasks/{api_name}. An AsyncAPI: the request is stored and answered {\"id\"} at once; predict "
            "receives parsed JSON, text for text/plain, bytes otherwise; it wants the API key whenever keys are set."
        ),
        header_parameters=(_REQUEST_ID_PARAMETER, {
            "name": "query_params", "in": "query", "required": False, "style": "form", "explode": True,
            # Any name and any value: a URL carries text only, and predict gets each value as a str.
            "schema": {"type": "object", "additionalProperties": True},
            "description": "any query parameters, handed to predict as query_params (values as strings)",
        }),
        request_body={"required": False, "content": {
            "application/json": {"schema": {}},
            "application/x-www-form-urlencoded": {
                "schema": {"type": "object", "additionalProperties": {"type": "string"}}},
            "multipart/form-data": {"schema": {"type": "object",
                                               "additionalProperties": {"oneOf": [{"type": "string"}, _BINARY]}}},
            "text/plain": {"schema": {"type": "string"}},
            "application/octet-stream": {"schema": _BINARY},
            "*/*": {"schema": _BINARY},
        }},
        realtime=True,
    ),
    ("GET", "/<api_name>/<request_id>"): Operation(
        "getAsyncRequest", "An AsyncAPI request's status, with its result once completed",
        {200: Answer("in_queue, in_progress, completed (with result and timestamp) or failed (with a one-line "
                     "message)", (schemas.AsyncRequestStatus,)),
         404: _error("api_not_found (not deployed, or not an AsyncAPI) or request_not_found (never submitted, "
                     "or kept no longer: SLUICE_ASYNC_RETENTION_S)")},
        description="Cortex's AsyncAPI result endpoint; it wants the API key whenever keys are set.",
    ),
    ("DELETE", "/<api_name>"): Operation(
        "stopJobAtApiPath", "Stop a batch or task API's job (Cortex's endpoint)",
        {200: Answer("stopped: no new batch starts; running ones finish", (schemas.Stopped,)),
         400: _error("bad_request: jobID is missing"),
         404: _error("api_not_found (not deployed) or job_not_found"),
         405: _error("method_not_allowed: the API is a RealtimeAPI (its replicas answer) or an AsyncAPI",
                     schemas.RealtimeError),
         409: _error("conflict: the job has already ended"),
         503: _error("not_ready: the API is a RealtimeAPI and the proxy could reach none of its replicas",
                     schemas.RealtimeError)},
        description="As DELETE /batch/{api_name} (a TaskAPI's: as DELETE /tasks/{api_name}).",
        query=schemas.JobQuery,
    ),
}

# Answered by every management operation but the open ones when API keys are set, and by a
# realtime API with SLUICE_PROTECT_REALTIME=1.
_UNAUTHORIZED = "unauthorized: API keys are set and the request has no valid `Authorization: Bearer <key>`"
_INSECURE_BIND = ("insecure_bind: no API keys are set and the request reached the management API on a "
                  "non-loopback address (set SLUICE_API_KEYS, bind 127.0.0.1, or SLUICE_ALLOW_ANONYMOUS=1)")


# -- building the document ----------------------------------------------------------------------

_RULE_ARGUMENT = re.compile(r"<(?:[^<>:]+:)?([^<>]+)>")


def openapi_path(rule: str) -> str:
    """`/batch/<api_name>` -> `/batch/{api_name}` (converters such as `<int:n>` dropped)."""
    return _RULE_ARGUMENT.sub(r"{\1}", rule)


def plain_rule(rule: str) -> str:
    """`/<unreserved:api_name>` -> `/<api_name>`: how OPERATIONS names a rule, whatever its converters."""
    return _RULE_ARGUMENT.sub(r"<\1>", rule)


def routes(app: Flask) -> list[tuple[str, str]]:
    """Every (method, plain rule) the app answers, in the order its routes were registered."""
    out = []
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) - IMPLICIT_METHODS):
            out.append((method, plain_rule(rule.rule)))
    return out


def undocumented(app: Flask) -> list[str]:
    """What the document cannot describe yet: routes without an operation, path parameters without words."""
    missing = [f"OPERATIONS[({method!r}, {rule!r})]" for method, rule in routes(app)
               if (method, rule) not in OPERATIONS]
    for rule in app.url_map.iter_rules():
        missing += [f"PATH_PARAMETERS[{name!r}] (of {rule.rule})" for name in sorted(rule.arguments)
                    if name not in PATH_PARAMETERS]
    return missing


def _models_of(operation: Operation) -> list[tuple[type[BaseModel], Mode]]:
    found: list[tuple[type[BaseModel], Mode]] = []
    for answer in operation.answers.values():
        found += [(model, "serialization") for model in answer.models]
    if operation.realtime:
        found.append((schemas.RealtimeError, "serialization"))
    else:
        found.append((schemas.Error, "serialization"))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("model"), type):
                found.append((node["model"], "validation"))
            for value in node.values():
                walk(value)

    walk(operation.request_body)
    return found


@lru_cache(maxsize=1)
def _components() -> tuple[dict[tuple[type[BaseModel], Mode], dict[str, Any]], dict[str, Any]]:
    """Every model's JSON Schema, generated once: (model, mode) -> its $ref, and the schemas by name."""
    wanted: dict[tuple[type[BaseModel], Mode], None] = {}
    for operation in OPERATIONS.values():
        wanted.update(dict.fromkeys(_models_of(operation)))
    # The deploy config travels as YAML inside the multipart body; its schema is listed all the same.
    wanted[(ApiConfig, "validation")] = None
    refs, definitions = models_json_schema(list(wanted), ref_template=SCHEMAS + "{model}")
    schemas_by_name = definitions.get("$defs", {})
    schemas_by_name["JobRequest"]["oneOf"] = one_source_rule()
    return refs, schemas_by_name  # type: ignore[return-value]  # only BaseModels were asked for


def one_source_rule() -> list[dict[str, Any]]:
    """What `parse_job_request` checks beyond the model's fields: exactly one input source, not null."""
    return [{"required": [source], "properties": {source: {"not": {"type": "null"}}}} for source in SOURCES]


def _schema_of(refs: dict[tuple[type[BaseModel], Mode], dict[str, Any]],
               models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    options = [refs[(model, "serialization")] for model in models]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _with_models(node: Any, refs: dict[tuple[type[BaseModel], Mode], dict[str, Any]]) -> Any:
    """A request body with every {"model": M} replaced by M's $ref (validation mode)."""
    if isinstance(node, dict):
        if isinstance(node.get("model"), type):
            return refs[(node["model"], "validation")]
        return {key: _with_models(value, refs) for key, value in node.items()}
    return node


def _query_parameters(model: type[Query]) -> list[dict[str, Any]]:
    """One parameter per field of a query model; a nullable field is simply optional in a URL."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    out = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        prop.pop("title", None)
        description = prop.pop("description", "")
        options = [o for o in prop.pop("anyOf", []) if o.get("type") != "null"]
        if options:
            prop = {**options[0], **prop} if len(options) == 1 else {**prop, "anyOf": options}
        if prop.get("default", 0) is None:
            del prop["default"]
        out.append({"name": name, "in": "query", "required": name in required, "description": description,
                    "schema": prop})
    return out


def _answers(operation: Operation, refs: dict[tuple[type[BaseModel], Mode], dict[str, Any]],
             write: bool = False) -> dict[str, Any]:
    answers = dict(operation.answers)
    if write and not operation.realtime:  # api/promises.py: a write no replica confirmed
        answers.setdefault(503, _error(_UNACKNOWLEDGED))
    if not operation.open:
        error_model = schemas.RealtimeError if operation.realtime else schemas.Error
        answers.setdefault(401, _error(_UNAUTHORIZED, error_model, **{"WWW-Authenticate": {
            "description": "Bearer", "schema": {"type": "string"}}}))
        if not operation.realtime:
            answers.setdefault(403, _error(_INSECURE_BIND))
    out: dict[str, Any] = {}
    for status in sorted(answers):
        answer = answers[status]
        response: dict[str, Any] = {"description": answer.description}
        headers = dict(answer.headers)
        if operation.realtime:
            headers["X-Request-ID"] = {"$ref": "#/components/headers/X-Request-ID"}
        if headers:
            response["headers"] = headers
        if answer.models:
            response["content"] = {"application/json": {"schema": _schema_of(refs, answer.models)}}
        elif answer.content is not None:
            response["content"] = answer.content
        if status in operation.links:
            response["links"] = operation.links[status]
        out[str(status)] = response
    return out


def _operation(method: str, rule: Any, refs: dict[tuple[type[BaseModel], Mode], dict[str, Any]]) -> dict[str, Any]:
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"},
         "description": PATH_PARAMETERS.get(name, "not documented yet")}
        for name in sorted(rule.arguments)
    ]
    operation = OPERATIONS.get((method, plain_rule(rule.rule)))
    if operation is None:
        return {"summary": "not documented yet", "x-undocumented": True, "parameters": parameters,
                "responses": {"default": {"description": "not documented yet"}}}
    parameters += list(operation.header_parameters)
    if operation.query is not None:
        parameters += _query_parameters(operation.query)
    out: dict[str, Any] = {"operationId": operation.operation_id, "summary": operation.summary}
    if operation.description:
        out["description"] = operation.description
    if parameters:
        out["parameters"] = parameters
    if operation.request_body is not None:
        out["requestBody"] = _with_models(operation.request_body, refs)
    if operation.open:
        out["security"] = []
    out["responses"] = _answers(operation, refs, write=method in ("POST", "PUT", "PATCH", "DELETE"))
    return out


def openapi_document(app: Flask) -> dict[str, Any]:
    """The document for `app`: one path per route of its url_map, in registration order."""
    refs, definitions = _components()
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) - IMPLICIT_METHODS):
            paths.setdefault(openapi_path(rule.rule), {})[method.lower()] = _operation(method, rule, refs)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Sluice",
            "version": sluice_version(),
            "description": "Batch jobs and realtime APIs, deployed from Cortex-style projects. With API keys "
                           "set, every operation but /healthz, /openapi.json and /docs wants `Authorization: "
                           "Bearer <key>` (realtime APIs only with SLUICE_PROTECT_REALTIME=1).",
        },
        # Concrete paths match before the `/{api_name}` template (OpenAPI 3, "Path Templating Matching").
        "paths": paths,
        "security": [{"bearer": []}, {}],
        "components": {
            "schemas": definitions,
            "headers": {"X-Request-ID": _REQUEST_ID_HEADER},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
