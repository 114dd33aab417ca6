"""Bad submissions get a precise status and message, and create no job."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import requests

from predictors_runtime.project import pack_project
from tests.hostile import billion_laughs, bundle_declaring

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


# -- limits at the edge (every one of these once answered 500, or was accepted) -------------------

DEEP = "[" * 995 + "1" + "]" * 995


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (DEEP, "nested deeper than the limit of 64 levels"),
        (f'{{"item_list": {{"items": [{DEEP}], "batch_size": 1}}}}', "nested deeper than the limit of 64 levels"),
        (f'{{"item_list": {{"items": [1], "batch_size": 1}}, "config": {{"k": {DEEP}}}}}',
         "nested deeper than the limit of 64 levels"),
        ('{"item_list": {"items": [' + "7" * 100_000 + '], "batch_size": 1}}', "more than the limit of 4300 digits"),
        ('{"item_list": {"items": [1], "batch_size": 1}, "timeout": 1' + "0" * 400 + "}",
         "timeout: must be from 1 to 2592000 (got an integer of 401 digits)"),
        ('{"item_list": {"items": [1], "batch_size": 1}, "workers": 1000000}', "workers: must be from 1 to 1000"),
        ('{"delimited_files": {"s3_paths": ["/tmp/\\u0000.jsonl"], "batch_size": 1}}',
         "delimited_files.s3_paths[0]: must not contain a NUL character"),
        ('{"delimited_files": {"s3_paths": ["/tmp/\\ud800.jsonl"], "batch_size": 1}}',
         "delimited_files.s3_paths[0]: not valid Unicode text"),
    ],
    ids=["deep-body", "deep-items", "deep-config", "huge-integer", "huge-timeout", "workers", "nul-path",
         "lone-surrogate-path"],
)
def test_a_hostile_submission_is_a_400_naming_the_limit_or_field_and_creates_no_job(client, target, body, words):
    api_name, url = target

    response = _post(url, body)

    assert response.status_code == 400
    assert words in response.json()["message"]
    assert client.jobs(api_name) == []


@pytest.mark.parametrize("limit", ["100000000000000000000", "0", "-5", "ten"])
def test_listing_jobs_with_a_limit_out_of_range_is_a_400_naming_the_range(target, limit):
    _, url = target

    response = requests.get(url, params={"limit": limit}, timeout=30)

    assert response.status_code == 400
    assert "limit must be an integer from 1 to 1000" in response.json()["message"]


def _deploy_raw(stack, config: str, project: bytes) -> requests.Response:
    files = {"config": ("cortex.yaml", config.encode(), "application/yaml"),
             "project": ("project.tar.gz", project, "application/gzip")}
    return requests.post(f"{stack.url}/apis", files=files, timeout=120)


def _small_project(tmp_path) -> bytes:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "predictor.py").write_text("class PythonPredictor:\n    pass\n")
    return pack_project(tmp_path / "project")


API_HEAD = "- name: {name}\n  kind: BatchAPI\n  predictor:\n    type: {type}\n    path: predictor.py\n"


def test_a_billion_laughs_cortex_yaml_is_a_400_naming_the_alias_limit(stack, client, tmp_path):
    config = billion_laughs(API_HEAD.format(name="laughs", type="python") + "    config:\n")

    response = _deploy_raw(stack, config, _small_project(tmp_path))

    assert response.status_code == 400
    assert "aliases expand the document by more than the limit of 100000 nodes" in response.json()["message"]
    assert "laughs" not in [api["name"] for api in client.apis()]


def test_a_cortex_yaml_nested_5000_deep_is_a_400_naming_the_depth_limit(stack, tmp_path):
    config = API_HEAD.format(name="deep", type="python") + "    config:\n      d: " + "[" * 5000 + "]" * 5000 + "\n"

    response = _deploy_raw(stack, config, _small_project(tmp_path))

    assert response.status_code == 400
    assert "nested deeper than the limit of 64 levels" in response.json()["message"]


def test_a_one_megabyte_project_holding_a_gibibyte_file_is_a_400_naming_the_limit(stack, client, tmp_path):
    bomb = bundle_declaring("predictor.py", (1 << 30) + (1 << 20))

    response = _deploy_raw(stack, API_HEAD.format(name="bomb", type="python"), bomb)

    assert response.status_code == 400
    assert "unpacks to more than 1073741824 bytes" in response.json()["message"]
    assert "bomb" not in [api["name"] for api in client.apis()]


def test_a_deploy_error_names_the_configured_models_folder_not_what_is_inside_it(stack, tmp_path):
    config = API_HEAD.format(name="peek", type="onnx") + "    models:\n      dir: /etc\n"

    response = _deploy_raw(stack, config, _small_project(tmp_path))

    assert response.status_code == 400
    message = response.json()["message"]
    assert "predictor.models: /etc: " in message
    assert "/etc/" not in message


def test_an_input_file_swapped_for_a_link_after_submission_is_not_read_by_the_worker(
    client, deploy_project, events_file, events, tmp_path
):
    outside = Path(tempfile.mkdtemp(prefix="sluice-outside-"))  # outside every allowed root
    try:
        (outside / "secret.jsonl").write_text('{"s":7}\n' * 3)
        inputs = tmp_path / "inputs"
        inputs.mkdir()
        (inputs / "a.jsonl").write_text('{"n":1}\n' * 3)
        (inputs / "b.jsonl").write_text('{"n":2}\n' * 3)  # same bytes per line as the secret
        api = deploy_project({"events": str(events_file), "sleep": 2})
        spec = client.submit_raw(api, {"delimited_files": {"s3_paths": [str(inputs)], "batch_size": 3}})
        deadline = time.monotonic() + 60
        while not any(e["event"] == "predict" for e in events(events_file)):  # a.jsonl's batch runs
            assert time.monotonic() < deadline, "the first batch never ran"
            time.sleep(0.05)

        (inputs / "b.jsonl").unlink()
        (inputs / "b.jsonl").symlink_to(outside / "secret.jsonl")

        final = client.wait(api, spec["job_id"], timeout=120)
        assert final["status"] == "status_completed_with_failures"
        (failed,) = client.failed_batches(api, spec["job_id"])
        assert f"{inputs / 'b.jsonl'}: refused, it leads outside the allowed local roots" in failed["error"]
        seen = [item for e in events(events_file) if e["event"] == "predict" for item in e["items"]]
        assert seen == [{"n": 1}] * 3
    finally:
        shutil.rmtree(outside, ignore_errors=True)
