"""Every answer of the management API fits the OpenAPI document (`GET /openapi.json`): the real app,
through Flask's test client, on a real redis-server.

The document itself, and a replica's answers, are checked fast in tests/unit/test_openapi.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.app import create_app
from api.openapi import openapi_document
from foundation.settings import Settings
from predictors_runtime.project import pack_project
from tests.unit.test_openapi import assert_fits

pytestmark = pytest.mark.integration


def _deploy(client: Any, folder: Path, apis: list[dict[str, Any]]) -> Any:
    folder.mkdir(exist_ok=True)
    (folder / "predictor.py").write_text("class PythonPredictor:\n    def __init__(self, config, job_spec=None):\n"
                                         "        pass\n\n    def predict(self, payload, batch_id=None):\n"
                                         "        return payload\n")
    data = {"config": (io.BytesIO(yaml.safe_dump(apis).encode()), "cortex.yaml"),
            "project": (io.BytesIO(pack_project(folder)), "project.tar.gz")}
    return client.post("/apis", data=data, content_type="multipart/form-data")


def test_every_management_answer_fits_the_document(redis_client, redis_server, tmp_path):
    url = redis_server.rsplit("/", 1)[0] + "/1"
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "rows.jsonl").write_text("1\n2\n")
    app = create_app(Settings(redis_url=url, storage=str(tmp_path / "storage"), cache_dir=str(tmp_path / "cache"),
                              local_input_roots=(str(inputs),)))
    client = app.test_client()
    document = openapi_document(app)

    def call(method: str, path: str, url: str, status: int, **kwargs: Any) -> Any:
        response = client.open(url, method=method, **kwargs)
        assert response.status_code == status, response.get_data(as_text=True)
        assert_fits(document, method, path, response)
        return response.get_json()

    python = {"type": "python", "path": "predictor.py"}
    deployed = _deploy(client, tmp_path / "project", [{"name": "rows", "kind": "BatchAPI", "predictor": python},
                                                      {"name": "echo", "kind": "RealtimeAPI", "predictor": python}])
    assert deployed.status_code == 201, deployed.get_data(as_text=True)
    assert_fits(document, "POST", "/apis", deployed)

    call("GET", "/openapi.json", "/openapi.json", 200)
    call("GET", "/apis", "/apis", 200)
    call("GET", "/apis/{name}", "/apis/rows", 200)
    assert call("GET", "/apis/{name}", "/apis/echo", 200)["replicas"] == []
    call("GET", "/apis/{name}", "/apis/nope", 404)
    body = {"item_list": {"items": [1, 2, 3], "batch_size": 2}, "config": {"k": 1}}
    dry = call("POST", "/batch/{api_name}", "/batch/rows?dryRun=true", 200, json=body)
    assert dry["dry_run"] is True
    job = call("POST", "/batch/{api_name}", "/batch/rows", 200, json=body)
    assert "output" not in job  # optional fields stay absent unless set
    call("POST", "/batch/{api_name}", "/batch/rows", 200,
         json={"delimited_files": {"s3_paths": [str(inputs)], "batch_size": 1}, "timeout": 60})
    call("POST", "/batch/{api_name}", "/batch/rows", 400, json={"item_list": {"items": []}})
    call("POST", "/batch/{api_name}", "/batch/rows?dryRun=maybe", 400, json=body)
    call("POST", "/batch/{api_name}", "/batch/nope", 404, json=body)
    status = call("GET", "/batch/{api_name}", f"/batch/rows?jobID={job['job_id']}", 200)
    assert status["job_status"]["job_id"] == job["job_id"]
    assert len(call("GET", "/batch/{api_name}", "/batch/rows", 200)["jobs"]) == 2
    refused = call("GET", "/batch/{api_name}", "/batch/rows?limit=ten", 400)
    assert "limit must be an integer from 1 to 1000" in refused["message"]
    call("GET", "/batch/{api_name}", "/batch/rows?jobID=nope", 404)
    call("GET", "/batch/{api_name}/failed", f"/batch/rows/failed?jobID={job['job_id']}", 200)
    assert "jobID is required" in call("GET", "/batch/{api_name}/failed", "/batch/rows/failed", 400)["message"]
    call("DELETE", "/batch/{api_name}", f"/batch/rows?jobID={job['job_id']}", 200)
    call("DELETE", "/batch/{api_name}", f"/batch/rows?jobID={job['job_id']}", 409)
    call("DELETE", "/apis/{name}", "/apis/rows", 409)
    assert len(call("DELETE", "/apis/{name}", "/apis/rows?force=true", 200)["stopped_jobs"]) == 1
    call("GET", "/{api_name}", "/rows", 404)
    not_ready = call("POST", "/{api_name}", "/echo", 503, json={})
    assert not_ready["kind"] == "not_ready" and not_ready["request_id"]
