"""The OpenAPI document (`GET /openapi.json`): valid OpenAPI 3.1, built from the app's routes and the
models that validate requests and build answers, and what the handlers answer fits it."""

from __future__ import annotations

import json
import time
import typing
from typing import Any

import pytest
from flask import Flask
from jsonschema import Draft202012Validator

from api.app import create_app
from api.openapi import OPERATIONS, PATH_PARAMETERS, openapi_document, openapi_path, routes, undocumented
from api.realtime import ReplicaSettings, create_replica_app
from api.schemas import JobStatusView, Source
from foundation.api_registry import DeployedApi
from foundation.figures import Recorder
from foundation.settings import Settings
from jobs.batch.submission import SOURCES, JobRequest
from predictors_runtime.config import ApiConfig
from predictors_runtime.realtime_predictor import RealtimePredictor

NOWHERE = "redis://127.0.0.1:1/0"  # no Redis listens there, and nothing here connects to it


def unconnected_app() -> Flask:
    """The management app, for its routes and document: its figures' thread is stopped at once
    (nothing was counted, so nothing is sent)."""
    app = create_app(Settings(redis_url=NOWHERE))
    app.extensions["sluice.figures"].close()
    return app


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    """The document as `/openapi.json` serves it (through JSON), for an app that connects to nothing."""
    return json.loads(json.dumps(openapi_document(unconnected_app())))


def _resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        _, *path = node["$ref"].split("/")
        node = document
        for part in path:
            node = node[part]
    return node


def _answer_schema(document: dict[str, Any], method: str, path: str, status: int) -> dict[str, Any] | None:
    operation = document["paths"][path][method.lower()]
    assert str(status) in operation["responses"], f"{method} {path} answered {status}, which the document does not list"
    content = operation["responses"][str(status)].get("content", {})
    return content.get("application/json", {}).get("schema")


def assert_fits(document: dict[str, Any], method: str, path: str, response: Any) -> None:
    """The answer's status is documented for the operation and its JSON body validates against its schema."""
    schema = _answer_schema(document, method, path, response.status_code)
    if schema is None:
        return
    validator = Draft202012Validator({"allOf": [schema], "components": document["components"]})
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(response.get_json())]
    assert not errors, f"{method} {path} -> {response.status_code}: {errors}"


# -- the document -------------------------------------------------------------------------------

def test_the_document_is_valid_openapi_3_1(document):
    from openapi_spec_validator import validate

    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_reference_resolves(document):
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                _resolve(document, node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)


def test_every_route_of_the_app_is_a_described_operation_of_the_document():
    """A new route shows up in the document by itself; this fails until OPERATIONS describes it."""
    app = unconnected_app()
    document = openapi_document(app)
    for method, rule in routes(app):
        assert method.lower() in document["paths"][openapi_path(rule)]
    missing = undocumented(app)
    assert not missing, "describe these in api/openapi.py: " + "; ".join(missing)


def test_the_operation_table_names_no_route_the_app_lacks():
    app = unconnected_app()
    assert set(OPERATIONS) <= set(routes(app))
    assert all(description for description in PATH_PARAMETERS.values())


def test_a_submission_is_described_by_the_model_that_validates_it(document):
    body = document["paths"]["/batch/{api_name}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    generated = JobRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    described = _resolve(document, body)
    assert {k: v for k, v in described.items() if k != "oneOf"} == {k: v for k, v in generated.items() if k != "$defs"}
    # The rule parse_job_request adds to the model: exactly one input source.
    assert [option["required"] for option in described["oneOf"]] == [[source] for source in SOURCES]
    for name, schema in generated["$defs"].items():
        assert document["components"]["schemas"][name] == schema


def test_a_deploy_config_is_described_by_the_model_that_validates_it(document):
    generated = ApiConfig.model_json_schema(ref_template="#/components/schemas/{model}")
    listed = json.loads(json.dumps(document["components"]["schemas"]["ApiConfig-Input"]).replace("-Input", ""))
    assert {k: v for k, v in listed.items() if k != "title"} == \
        {k: v for k, v in generated.items() if k not in ("$defs", "title")}
    assert "ApiConfig-Input" in str(document["paths"]["/apis"]["post"]["requestBody"])


def test_query_parameters_come_from_their_models_with_their_bounds(document):
    parameters = {p["name"]: p for p in document["paths"]["/batch/{api_name}"]["get"]["parameters"]}
    assert parameters["limit"]["schema"] == {"default": 100, "maximum": 1000, "minimum": 1, "type": "integer"}
    assert parameters["jobID"]["required"] is False
    stop = {p["name"]: p for p in document["paths"]["/batch/{api_name}"]["delete"]["parameters"]}
    assert stop["jobID"]["required"] is True
    assert stop["api_name"]["in"] == "path"


def test_the_sources_of_a_dry_run_are_the_submission_sources():
    assert set(typing.get_args(Source)) == set(SOURCES)


def test_a_field_an_answer_gains_without_its_model_is_refused():
    view = {"job_id": "j", "api_name": "a", "kind": "BatchAPI", "workers": 1, "config": {}, "timeout": None,
            "total_batch_count": 1, "start_time": "2024-01-01T00:00:00Z", "status": "status_running",
            "batches_in_queue": 1, "batch_metrics": {"succeeded": 0, "failed": 0, "average_time_per_batch": None},
            "worker_counts": {"pending": 0, "running": 1, "succeeded": 0, "failed": 0}, "end_time": None}
    JobStatusView.model_validate(view)
    with pytest.raises(ValueError, match="progress"):
        JobStatusView.model_validate({**view, "progress": 0.5})


def test_a_realtime_api_answers_readiness_and_predictions_with_a_request_id_on_every_answer(document):
    path = {method: operation for method, operation in document["paths"]["/{api_name}"].items()
            if method in ("get", "post")}
    assert set(path["get"]["responses"]) == {"200", "400", "401", "404", "503"}
    assert set(path["post"]["responses"]) >= {"200", "400", "404", "500", "503", "504"}
    assert set(path["post"]["requestBody"]["content"]) >= {
        "application/json", "application/x-www-form-urlencoded", "multipart/form-data", "text/plain",
        "application/octet-stream",
    }
    for operation in path.values():
        assert any(p["name"] == "X-Request-ID" and p["in"] == "header" for p in operation["parameters"])
        for response in operation["responses"].values():
            assert "X-Request-ID" in response["headers"]
    error = _resolve(document, path["post"]["responses"]["503"]["content"]["application/json"]["schema"])
    assert {"kind", "message", "request_id"} <= set(error["properties"])
    assert "Retry-After" in path["post"]["responses"]["503"]["headers"]


def test_a_batch_apis_own_path_is_cortexs_job_endpoint(document):
    path = document["paths"]["/{api_name}"]
    options = path["get"]["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]
    answers = [set(_resolve(document, option)["properties"]) for option in options]
    assert {"job_status", "endpoint", "api_spec"} in answers
    assert "BatchAPI" in path["post"]["description"]
    assert set(path["delete"]["responses"]) >= {"200", "400", "401", "404", "405", "409"}
    assert any(p["name"] == "jobID" and p["required"] for p in path["delete"]["parameters"])


def test_a_realtime_api_lists_its_replicas(document):
    answer = document["paths"]["/apis/{name}"]["get"]["responses"]["200"]
    api = _resolve(document, answer["content"]["application/json"]["schema"])
    replicas = next(o for o in api["properties"]["replicas"]["anyOf"] if o.get("type") == "array")
    replica = _resolve(document, replicas["items"])
    assert {"id", "address", "ready", "draining", "bundle", "message", "failing", "last_oom_at", "last_oom",
            "devices"} == set(replica["properties"])


# -- what the handlers answer fits the document -------------------------------------------------

# Every management answer fitting the document needs the app on Redis:
# tests/integration/test_openapi_management_answers.py.


def test_a_replica_answers_fit_the_document(document, tmp_path):
    class Echo:
        def __init__(self) -> None:
            pass

        def predict(self, payload: Any) -> Any:
            if payload == {"fail": True}:
                raise ValueError("no")
            return payload

    config = ApiConfig.from_dict({"name": "echo", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"}})
    api = DeployedApi(name="echo", kind="RealtimeAPI", spec=config.to_dict(), bundle="b", queue="cpu",
                      deployed_at=time.time(), ignored_fields=[])
    settings = ReplicaSettings(api=api, project_dir=tmp_path, state_dir=tmp_path / "state", replica_id="r1")
    app = create_replica_app(settings, lambda s, a: RealtimePredictor(Echo(), None), configure_logging=False,
                             recorder=Recorder.for_url(NOWHERE))  # never started: figures stay in memory
    assert app.extensions["sluice.replica"].wait(30)
    client = app.test_client()

    for method, kwargs, status in [("GET", {}, 200), ("POST", {"json": {"a": 1}}, 200),
                                   ("POST", {"json": {"fail": True}}, 500),
                                   ("POST", {"data": b"{", "content_type": "application/json"}, 400)]:
        response = client.open("/echo", method=method, **kwargs)
        assert response.status_code == status, response.get_data(as_text=True)
        assert response.headers["X-Request-ID"]
        assert_fits(document, method, "/{api_name}", response)
