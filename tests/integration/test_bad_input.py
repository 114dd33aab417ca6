"""Bad submissions get a precise status and message, and create no job."""

from __future__ import annotations

import json

import pytest
import requests

pytestmark = pytest.mark.integration


@pytest.fixture
def target(stack, deploy_project, events_file):
    api_name = deploy_project({"events": str(events_file)})
    return api_name, f"{stack.url}/batch/{api_name}"


def _post(url: str, body: bytes | str, content_type: str = "application/json") -> requests.Response:
    return requests.post(url, data=body, headers={"Content-Type": content_type}, timeout=30)


GOOD = {"workers": 1, "item_list": {"items": [1, 2, 3], "batch_size": 2}}


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ("{not json", 400, "bad_request", "not valid JSON"),
        ("", 400, "bad_request", "empty"),
        ("[1, 2]", 400, "bad_request", "JSON object"),
        (json.dumps({"workers": 1}), 400, "bad_request", "got none"),
        (json.dumps({**GOOD, "delimited_files": {"s3_paths": ["s3://b/x"], "batch_size": 1}}), 400, "bad_request",
         "got item_list and delimited_files"),
        (json.dumps({"item_list": {"items": [1], "batch_size": 0}}), 400, "bad_request", "item_list.batch_size"),
        (json.dumps({"item_list": {"items": [], "batch_size": 1}}), 400, "bad_request", "item_list.items"),
        (json.dumps({**GOOD, "workers": 0}), 400, "bad_request", "workers"),
        (json.dumps({**GOOD, "colour": "red"}), 400, "bad_request", "colour: unknown field"),
        (json.dumps({**GOOD, "timeout": "soon"}), 400, "bad_request", "timeout"),
    ],
)
def test_a_bad_submission_is_refused_with_a_clear_message_and_creates_no_job(
    client, target, body, status, kind, words
):
    api_name, url = target

    response = _post(url, body)

    assert response.status_code == status
    assert response.json()["kind"] == kind
    assert words in response.json()["message"]
    assert client.jobs(api_name) == []


def test_a_body_over_ten_mebibytes_is_refused_with_413(client, target):
    api_name, url = target
    body = json.dumps({"item_list": {"items": ["x" * 1024] * (11 * 1024), "batch_size": 10}})

    response = _post(url, body)

    assert response.status_code == 413
    assert response.json()["kind"] == "payload_too_large"
    assert client.jobs(api_name) == []


def test_an_unknown_api_is_a_404(stack):
    response = _post(f"{stack.url}/batch/no-such-api", json.dumps(GOOD))

    assert response.status_code == 404
    assert response.json() == {"kind": "api_not_found", "message": "api no-such-api is not deployed"}


def test_an_unknown_job_id_is_a_404_for_status_and_stop(target):
    _, url = target

    for method in (requests.get, requests.delete):
        response = method(url, params={"jobID": "0000000000ffffffff"}, timeout=30)
        assert response.status_code == 404
        assert response.json()["kind"] == "job_not_found"


def test_a_job_of_another_api_is_not_found_under_this_one(client, stack, deploy_project, events_file):
    first, second = deploy_project({"events": str(events_file)}), deploy_project({"events": str(events_file)})
    spec = client.submit(first, [1], batch_size=1)

    response = requests.get(f"{stack.url}/batch/{second}", params={"jobID": spec["job_id"]}, timeout=30)

    assert response.status_code == 404


def test_a_dry_run_validates_without_creating_a_job(client, target):
    api_name, url = target

    response = requests.post(url, params={"dryRun": "true"}, json=GOOD, timeout=30)

    assert response.status_code == 200
    assert response.json()["total_batch_count"] == 2
    assert client.jobs(api_name) == []


def test_errors_of_unknown_routes_are_json_too(stack):
    response = requests.get(f"{stack.url}/nothing/here", timeout=30)

    assert response.status_code == 404
    assert set(response.json()) == {"kind", "message"}
