"""The OpenAPI document of Sluice's HTTP API: what its public address (the proxy) answers.

The management paths (`/apis`, `/batch/...`, `/healthz`, `/metrics`) are served by the
management API; `/{api_name}` of a realtime API by its replicas (or, while none is ready, by the
management API's fallback, with the same error shape).
"""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}
_REALTIME_ERROR = {"$ref": "#/components/schemas/RealtimeError"}
_REQUEST_ID = {"$ref": "#/components/headers/X-Request-ID"}

# What each realtime error status means (the `kind` of its body).
_REALTIME_ERRORS = {
    400: "bad_request (a body that does not parse) or invalid_model_input (a model input of the wrong name, shape or type)",
    404: "api_not_found (not deployed, or a BatchAPI) or model_not_found (an unknown model name or version)",
    413: "payload_too_large",
    500: "predictor_error: predict raised, or returned what cannot be sent",
    503: "not_ready (no replica is ready yet; the message says why) or overloaded (every replica busy and "
         "its queue full: retry after Retry-After seconds)",
    504: "request_timeout: the API's request_timeout ran out while the request waited or ran",
}


def _responses(ok: str, *errors: int, ok_schema: dict[str, Any] | None = None) -> dict[str, Any]:
    success: dict[str, Any] = {"description": ok}
    if ok_schema is not None:
        success["content"] = {"application/json": {"schema": ok_schema}}
    out: dict[str, Any] = {"200": success}
    for status in errors:
        out[str(status)] = {"description": "error", "content": {"application/json": {"schema": _ERROR}}}
    return out


def _realtime_responses(ok: dict[str, Any], *errors: int) -> dict[str, Any]:
    """A realtime answer: every one, success or error, carries the request's X-Request-ID."""
    out: dict[str, Any] = {"200": {**ok, "headers": {"X-Request-ID": _REQUEST_ID}}}
    for status in errors:
        headers: dict[str, Any] = {"X-Request-ID": _REQUEST_ID}
        if status == 503:
            headers["Retry-After"] = {
                "description": "with kind overloaded: seconds after which to try again",
                "schema": {"type": "integer"},
            }
        out[str(status)] = {
            "description": _REALTIME_ERRORS[status],
            "headers": headers,
            "content": {"application/json": {"schema": _REALTIME_ERROR}},
        }
    return out


def _realtime_path(api_name: dict[str, Any]) -> dict[str, Any]:
    request_id = {
        "name": "X-Request-ID", "in": "header", "required": False, "schema": {"type": "string"},
        "description": "kept as the request's id (in logs and the answer); the proxy makes one up when absent",
    }
    query = {
        "name": "query_params", "in": "query", "required": False, "style": "form", "explode": True,
        "schema": {"type": "object", "additionalProperties": {"type": "string"}},
        "description": "any query parameters, handed to predict as query_params",
    }
    binary = {"type": "string", "format": "binary"}
    return {
        "get": {
            "summary": "Readiness of a realtime API",
            "description": "200 once a replica of the API has built its predictor and loaded its models.",
            "parameters": [api_name, request_id],
            "responses": _realtime_responses(
                {
                    "description": "ready, with the model versions being served",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}},
                },
                404, 503,
            ),
        },
        "post": {
            "summary": "Predict: the predictor's predict(payload, query_params, headers)",
            "description": (
                "The payload predict receives depends on the Content-Type: parsed JSON, a multi-dict of "
                "form fields and files, decoded text, or the body's bytes for any other type. The answer "
                "is JSON for a JSON-able result, text/plain for a str, application/octet-stream for bytes, "
                "or whatever response the predictor built."
            ),
            "parameters": [api_name, request_id, query],
            "requestBody": {
                "required": False,
                "content": {
                    "application/json": {"schema": {}},
                    "application/x-www-form-urlencoded": {
                        "schema": {"type": "object", "additionalProperties": {"type": "string"}},
                    },
                    "multipart/form-data": {
                        "schema": {"type": "object", "additionalProperties": {"oneOf": [{"type": "string"}, binary]}},
                    },
                    "text/plain": {"schema": {"type": "string"}},
                    "application/octet-stream": {"schema": binary},
                    "*/*": {"schema": binary},
                },
            },
            "responses": _realtime_responses(
                {
                    "description": "what predict returned",
                    "content": {
                        "application/json": {"schema": {}},
                        "text/plain": {"schema": {"type": "string"}},
                        "application/octet-stream": {"schema": binary},
                    },
                },
                400, 404, 413, 500, 503, 504,
            ),
        },
    }


def openapi_document() -> dict[str, Any]:
    api_name = {"name": "api_name", "in": "path", "required": True, "schema": {"type": "string"}}
    job_id = {"name": "jobID", "in": "query", "required": True, "schema": {"type": "string"}}
    api_ref = {"$ref": "#/components/schemas/Api"}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Sluice", "version": "0.1.0"},
        "paths": {
            "/batch/{api_name}": {
                "post": {
                    "summary": "Submit a batch job",
                    "parameters": [api_name, {"name": "dryRun", "in": "query", "schema": {"type": "boolean"}}],
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/JobSubmission"}}}},
                    "responses": _responses("the job spec", 400, 404, 413),
                },
                "get": {
                    "summary": "A job's status (with jobID) or the API's jobs, newest first",
                    "parameters": [api_name, {**job_id, "required": False}],
                    "responses": _responses("job status or job list", 400, 404),
                },
                "delete": {
                    "summary": "Stop a job",
                    "parameters": [api_name, job_id],
                    "responses": _responses("stopped", 400, 404, 409),
                },
            },
            "/batch/{api_name}/failed": {
                "get": {
                    "summary": "Failed batches of a job",
                    "parameters": [api_name, job_id],
                    "responses": _responses("failed batches", 400, 404),
                }
            },
            "/apis": {
                "get": {
                    "summary": "Deployed APIs",
                    "responses": _responses("list", ok_schema={
                        "type": "object", "properties": {"apis": {"type": "array", "items": api_ref}},
                    }),
                },
                "post": {"summary": "Deploy a project (multipart: config, project)", "responses": _responses("deployed", 400, 413)},
            },
            "/apis/{name}": {
                "get": {
                    "summary": "One API; a realtime API's answer also lists its live replicas",
                    "parameters": [{**api_name, "name": "name"}],
                    "responses": _responses("api", 404, ok_schema=api_ref),
                },
                "delete": {"summary": "Delete an API", "parameters": [{**api_name, "name": "name"}], "responses": _responses("deleted", 404, 409)},
            },
            "/healthz": {"get": {"summary": "Liveness and readiness", "responses": _responses("ok", 503)}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": _responses("metrics")}},
            # Concrete paths above match before this template (OpenAPI 3, "Path Templating Matching").
            "/{api_name}": _realtime_path(api_name),
        },
        "components": {
            "headers": {
                "X-Request-ID": {
                    "description": "the request's id: the client's own X-Request-ID, or a new one",
                    "schema": {"type": "string"},
                },
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
                    "required": ["kind", "message"],
                },
                "RealtimeError": {
                    "type": "object",
                    "properties": {
                        "kind": {
                            "type": "string",
                            "enum": ["bad_request", "invalid_model_input", "api_not_found", "model_not_found",
                                     "payload_too_large", "predictor_error", "not_ready", "overloaded",
                                     "request_timeout", "bad_gateway", "method_not_allowed"],
                        },
                        "message": {"type": "string"},
                        "request_id": {"type": "string"},
                    },
                    "required": ["kind", "message"],
                },
                "Readiness": {
                    "type": "object",
                    "properties": {
                        "ready": {"type": "boolean", "enum": [True]},
                        "models": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "name": {"type": "string"},
                                    "versions": {"type": "array", "items": {"type": "integer"}},
                                },
                                "required": ["name", "versions"],
                            },
                        },
                    },
                    "required": ["ready", "models"],
                },
                "Api": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string", "enum": ["BatchAPI", "RealtimeAPI"]},
                        "bundle": {"type": "string"},
                        "queue": {"type": "string", "enum": ["cpu", "gpu", "inf"]},
                        "deployed_at": {"type": "number"},
                        "ignored_fields": {"type": "array", "items": {"type": "string"}},
                        "spec": {"type": "object"},
                        "endpoint": {"type": "string", "description": "RealtimeAPI only: /<name>"},
                        "replicas": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Replica"},
                            "description": "RealtimeAPI only, in GET /apis/{name}: its live replicas on every host",
                        },
                    },
                    "required": ["name", "kind", "bundle", "queue"],
                },
                "Replica": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"},
                        "address": {"type": "string", "description": "host:port the proxy reaches it at"},
                        "ready": {"type": "boolean"},
                        "draining": {"type": "boolean", "description": "being replaced or stopped: gets no new requests"},
                        "bundle": {"type": "string", "description": "the deployment it serves"},
                        "message": {"type": "string", "description": "why it is not ready, if known"},
                    },
                    "required": ["id", "address", "ready", "draining", "bundle"],
                },
                "JobSubmission": {
                    "type": "object",
                    "properties": {
                        "workers": {"type": "integer", "minimum": 1},
                        "item_list": {
                            "type": "object",
                            "properties": {"items": {"type": "array", "minItems": 1}, "batch_size": {"type": "integer", "minimum": 1}},
                            "required": ["items", "batch_size"],
                        },
                        "config": {"type": "object"},
                        # OpenAPI 3.0's exclusiveMinimum is a flag on minimum (JSON Schema draft 4/5 style).
                        "batch_timeout": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 86400},
                        "timeout": {"type": "integer", "minimum": 1},
                        "sqs_dead_letter_queue": {
                            "type": "object",
                            "properties": {"arn": {"type": "string"}, "max_receive_count": {"type": "integer", "minimum": 1}},
                        },
                    },
                },
            },
        },
    }
