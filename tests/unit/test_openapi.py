"""The OpenAPI document (`GET /openapi.json`): valid OpenAPI 3, and it describes the realtime paths."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.openapi import openapi_document


def _resolve(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        _, *path = node["$ref"].split("/")
        node = document
        for part in path:
            node = node[part]
    return node


def test_the_document_is_valid_openapi_3():
    validator = pytest.importorskip("openapi_spec_validator")
    document = json.loads(json.dumps(openapi_document()))  # as /openapi.json serves it
    validator.validate(document)


def test_every_reference_resolves():
    document = openapi_document()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                _resolve(document, node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)


def test_a_realtime_api_answers_readiness_and_predictions_with_a_request_id_on_every_answer():
    document = openapi_document()
    path = document["paths"]["/{api_name}"]
    assert set(path["get"]["responses"]) == {"200", "404", "503"}
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


def test_a_realtime_api_lists_its_replicas():
    document = openapi_document()
    api = _resolve(document, document["paths"]["/apis/{name}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"])
    replica = _resolve(document, api["properties"]["replicas"]["items"])
    assert {"id", "address", "ready", "draining", "bundle", "message"} == set(replica["properties"])
