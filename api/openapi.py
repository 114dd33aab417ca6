"""The OpenAPI document of Sluice's HTTP API."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}


def _responses(ok: str, *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": ok}}
    for status in errors:
        out[str(status)] = {"description": "error", "content": {"application/json": {"schema": _ERROR}}}
    return out


def openapi_document() -> dict[str, Any]:
    api_name = {"name": "api_name", "in": "path", "required": True, "schema": {"type": "string"}}
    job_id = {"name": "jobID", "in": "query", "required": True, "schema": {"type": "string"}}
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
                "get": {"summary": "Deployed APIs", "responses": _responses("list")},
                "post": {"summary": "Deploy a project (multipart: config, project)", "responses": _responses("deployed", 400, 413)},
            },
            "/apis/{name}": {
                "get": {"summary": "One API", "parameters": [{**api_name, "name": "name"}], "responses": _responses("api", 404)},
                "delete": {"summary": "Delete an API", "parameters": [{**api_name, "name": "name"}], "responses": _responses("deleted", 404, 409)},
            },
            "/healthz": {"get": {"summary": "Liveness and readiness", "responses": _responses("ok", 503)}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": _responses("metrics")}},
        },
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
                    "required": ["kind", "message"],
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
                        "timeout": {"type": "integer", "minimum": 1},
                        "sqs_dead_letter_queue": {
                            "type": "object",
                            "properties": {"arn": {"type": "string"}, "max_receive_count": {"type": "integer", "minimum": 1}},
                        },
                    },
                },
            }
        },
    }
