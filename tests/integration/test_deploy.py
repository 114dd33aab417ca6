"""Deploying, redeploying, listing and deleting APIs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from sluice.client import ClientError
from tests.integration.conftest import write_project

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def _wait_for(check, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_a_deployed_api_is_listed_described_and_deleted(client, deploy_project, events_file):
    api = deploy_project({"events": str(events_file)})

    assert api in [a["name"] for a in client.apis()]
    described = client.api(api)
    assert described["kind"] == "BatchAPI"
    assert described["queue"] == "cpu"
    assert described["spec"]["predictor"]["path"] == "predictor.py"
    assert len(described["bundle"]) == 64

    assert client.delete_api(api)["message"] == f"deleted api {api}"
    with pytest.raises(ClientError) as missing:
        client.api(api)
    assert missing.value.http_status == 404


def test_redeploying_changes_the_code_of_new_jobs_while_running_jobs_keep_theirs(
    client, deploy_project, tmp_path, events
):
    old_events, new_events = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    api = deploy_project({"sleep": 0.05}, version="v1")
    old_job = client.submit(api, list(range(60)), batch_size=2, workers=1, config={"events": str(old_events)})
    _wait_for(lambda: len(events(old_events)) >= 3)

    deploy_project({"sleep": 0.05}, name=api, version="v2")
    new_job = client.submit(api, list(range(10)), batch_size=2, workers=1, config={"events": str(new_events)})

    for spec in (old_job, new_job):
        assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"
    assert {e["version"] for e in events(old_events)} == {"v1"}
    assert {e["version"] for e in events(new_events)} == {"v2"}


def test_deleting_an_api_with_a_running_job_needs_force_and_stops_the_job(client, deploy_project, events_file):
    api = deploy_project({"events": str(events_file), "sleep": 0.2})
    spec = client.submit(api, list(range(100)), batch_size=1)

    with pytest.raises(ClientError) as refused:
        client.delete_api(api)
    assert refused.value.http_status == 409

    answer = client.delete_api(api, force=True)
    assert answer["stopped_jobs"] == [spec["job_id"]]


def test_an_invalid_cortex_yaml_is_refused_naming_the_file_and_field(client, tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "predictor.py").write_text("class PythonPredictor:\n    pass\n")
    (folder / "cortex.yaml").write_text(
        "- name: broken-api\n  kind: BatchAPI\n  predictor:\n"
        "    type: python\n    path: predictor.py\n    colour: red\n"
    )

    with pytest.raises(ClientError) as refused:
        client.deploy(folder / "cortex.yaml")

    assert refused.value.http_status == 400
    assert "cortex.yaml" in refused.value.server_message
    assert "predictor.colour" in refused.value.server_message


def test_an_autoscaling_figure_that_cannot_work_is_refused_naming_the_field(client, tmp_path):
    folder = tmp_path / "badly-scaled"
    folder.mkdir()
    (folder / "predictor.py").write_text("class PythonPredictor:\n    pass\n")
    (folder / "cortex.yaml").write_text(
        "- name: badly-scaled\n  kind: RealtimeAPI\n  predictor: {path: predictor.py}\n"
        "  autoscaling: {min_replicas: 3, max_replicas: 2}\n"
    )

    with pytest.raises(ClientError) as refused:
        client.deploy(folder / "cortex.yaml")

    assert refused.value.http_status == 400
    assert "autoscaling.min_replicas: must be <= max_replicas (3 > 2)" in refused.value.server_message
    assert "badly-scaled" not in [a["name"] for a in client.apis()]


def test_a_predictor_path_missing_from_the_project_is_refused(client, tmp_path):
    folder = tmp_path / "missing"
    folder.mkdir()
    (folder / "cortex.yaml").write_text(
        "- name: missing-file\n  kind: BatchAPI\n  predictor:\n    type: python\n    path: nowhere.py\n"
    )

    with pytest.raises(ClientError) as refused:
        client.deploy(folder / "cortex.yaml")

    assert refused.value.http_status == 400
    assert "nowhere.py" in refused.value.server_message


def test_a_deploy_without_its_files_is_a_clear_400(stack):
    response = requests.post(f"{stack.url}/apis", timeout=30)

    assert response.status_code == 400
    assert "config" in response.json()["message"]


def test_health_metrics_and_openapi_are_served(stack, client, deploy_project, events_file):
    api = deploy_project({"events": str(events_file)})
    client.wait(api, client.submit(api, [1], batch_size=1)["job_id"], timeout=60)

    health = requests.get(f"{stack.url}/healthz", timeout=30).json()
    assert health["status"] == "ok"
    assert len(health["worker_nodes"]) == 2
    assert all(set(queues) >= {"cpu", "gpu", "inf"} for queues in health["worker_nodes"].values())
    metrics = requests.get(f"{stack.url}/metrics", timeout=30).text
    assert "sluice_jobs_submitted_total" in metrics
    spec = requests.get(f"{stack.url}/openapi.json", timeout=30).json()
    assert "/batch/{api_name}" in spec["paths"]


def test_a_project_with_a_python_file_that_does_not_compile_is_refused_at_deploy_with_file_and_line(
        client, tmp_path):
    name = f"syntax-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / name
    config = write_project(folder, name, files={"helpers.py": "def ok():\n    return 1\n\ndef broken(:\n    pass\n"})
    with pytest.raises(ClientError) as refused:
        client.deploy(config)
    assert refused.value.http_status == 400
    assert "helpers.py line 4" in refused.value.message and "def broken(:" in refused.value.message
    with pytest.raises(ClientError):
        client.get_api(name)


def test_a_batch_api_whose_predictor_fails_to_build_is_shown_in_error_until_a_build_succeeds(
        client, tmp_path, events_file):
    name = f"nobuild-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / name
    broken = ("class PythonPredictor:\n    def __init__(self, config, job_spec):\n"
              "        raise OSError('model.pkl is missing')\n")
    config = write_project(folder, name, source=broken)
    client.deploy(config)
    spec = client.submit_job(name, {"workers": 1, "item_list": {"items": [1, 2], "batch_size": 1}})
    assert client.wait_job(name, spec["job_id"], timeout=120)["status"] == "status_worker_error"
    failure = client.get_api(name)["build_error"]
    assert "model.pkl is missing" in failure["message"]
    listed = {row["name"]: row["status"] for row in json.loads(_sluice(client.url, "get", "-o", "json").stdout)}
    assert listed[name] == "error"
    shown = _sluice(client.url, "get", name).stdout
    assert "error: building the predictor failed" in shown and "model.pkl is missing" in shown
    write_project(folder, name, {"events": str(events_file)})  # fixed
    client.deploy(config)
    assert "build_error" not in client.get_api(name)
    spec = client.submit_job(name, {"workers": 1, "item_list": {"items": [1], "batch_size": 1},
                                    "config": {"events": str(events_file)}})
    assert client.wait_job(name, spec["job_id"], timeout=120)["status"] == "status_succeeded"
    assert "build_error" not in client.get_api(name)


def _sluice(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "--url", url, *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
