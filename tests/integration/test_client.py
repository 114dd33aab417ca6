"""`sluice.client()` and `cortex.client()` against a live stack: every method, and typed errors."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

import cortex
import sluice
from sluice.client import default_url

from .conftest import read_events, write_project

pytestmark = pytest.mark.integration

REALTIME_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config):
        self.greeting = config.get("greeting", "hello")

    def predict(self, payload):
        return {"greeting": self.greeting, "echo": payload}
'''

# A batch predictor that, once its job ends, deploys another API through Cortex's Python client,
# exactly as Cortex's batch documentation shows, and lists the APIs through Sluice's.
CHAINING_PREDICTOR = '''
import json, os


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config

    def predict(self, payload, batch_id):
        pass

    def on_job_complete(self):
        import cortex
        import sluice

        client = cortex.client()
        api_spec = {
            "name": self.config["deploy_name"],
            "kind": "BatchAPI",
            "predictor": {"type": "python", "path": "predictor.py", "config": {"deployed_by": "on_job_complete"}},
        }
        deployed = client.create_api(api_spec, project_dir=os.path.dirname(os.path.abspath(__file__)))
        names = [api["name"] for api in sluice.client().list_apis()]
        with open(self.config["events"], "a") as f:
            f.write(json.dumps({"deployed": [api["name"] for api in deployed], "listed": names,
                                "url": os.environ.get("SLUICE_URL")}) + "\\n")
'''


def _name() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s")


def test_the_client_finds_sluice_from_sluice_url_then_the_predictors_api_url():
    assert default_url({"SLUICE_URL": "http://a:1/", "SLUICE_API_URL": "http://b:2"}) == "http://a:1"
    assert default_url({"SLUICE_API_URL": "http://b:2"}) == "http://b:2"
    assert default_url({}) == "http://127.0.0.1:8888"
    assert sluice.client("http://c:3").url == "http://c:3"
    assert cortex.client("http://c:3").url == "http://c:3"


def test_create_api_deploys_a_realtime_spec_from_a_project_folder_and_predict_answers(stack, tmp_path):
    cx = sluice.client(stack.url)
    name = _name()
    (tmp_path / "predictor.py").write_text(REALTIME_PREDICTOR)
    spec = {"name": name, "kind": "RealtimeAPI",
            "predictor": {"type": "python", "path": "predictor.py", "config": {"greeting": "hi"}}}

    deployed = cx.create_api(spec, project_dir=tmp_path, wait=True)

    assert [(api["name"], api["kind"]) for api in deployed] == [(name, "RealtimeAPI")]
    assert cx.predict(name, {"x": 1}) == {"greeting": "hi", "echo": {"x": 1}}
    described = cx.get_api(name)
    assert described["endpoint"] == f"{stack.url}/{name}" and any(r["ready"] for r in described["replicas"])
    assert name in [api["name"] for api in cx.list_apis()]

    assert cx.delete_api(name)["message"] == f"deleted api {name}"
    with pytest.raises(sluice.ApiNotFound) as raised:
        cx.get_api(name)
    assert (raised.value.http_status, raised.value.kind) == (404, "api_not_found")
    assert f"api {name} is not deployed" in raised.value.server_message


def test_a_batch_job_is_submitted_followed_and_waited_for_through_the_client(stack, tmp_path, events_file):
    cx = sluice.client(stack.url)
    name = _name()
    cx.deploy(write_project(tmp_path / name, name, {"events": str(events_file)}))

    spec = cx.submit_job(name, {"workers": 1, "item_list": {"items": list(range(6)), "batch_size": 2}})
    assert spec["api_name"] == name and spec["total_batch_count"] == 3
    # Cortex's shape: what `GET /batch/<api>?jobID=` answers, with an absolute endpoint.
    job = cx.get_job(name, spec["job_id"])
    assert set(job) == {"job_status", "endpoint", "api_spec"}
    assert job["job_status"]["job_id"] == spec["job_id"] and job["api_spec"]["name"] == name
    assert job["endpoint"].startswith(f"{stack.url}/") and job["endpoint"].endswith(f"/{name}")
    assert cortex.client(stack.url).get_job(name, spec["job_id"])["job_status"]["job_id"] == spec["job_id"]
    assert cx.get_api(name)["endpoint"] == f"{stack.url}/{name}"

    final = cx.wait_job(name, spec["job_id"], timeout=120)

    assert final["status"] == "status_succeeded"
    assert final["batch_metrics"]["succeeded"] == 3
    assert cx.get_job(name, spec["job_id"])["job_status"]["status"] == "status_succeeded"
    assert cx.job(name, spec["job_id"]) == final  # Sluice's own job() is the bare job_status
    with pytest.raises(sluice.Conflict) as raised:
        cx.stop_job(name, spec["job_id"])
    assert raised.value.http_status == 409


def test_stop_job_stops_a_running_job_and_wait_job_returns_its_final_status(stack, tmp_path, events_file):
    cx = sluice.client(stack.url)
    name = _name()
    cx.deploy(write_project(tmp_path / name, name, {"events": str(events_file), "sleep": 1}))
    spec = cx.submit_job(name, {"workers": 1, "item_list": {"items": list(range(40)), "batch_size": 1}})
    _until(lambda: cx.get_job(name, spec["job_id"])["job_status"]["status"] == "status_running", 60, "the job running")

    assert cx.stop_job(name, spec["job_id"])["message"] == f"stopped job {spec['job_id']}"

    assert cx.wait_job(name, spec["job_id"], timeout=60)["status"] == "status_stopped"


def test_wait_job_gives_up_after_its_timeout(stack, tmp_path, events_file):
    cx = sluice.client(stack.url)
    name = _name()
    cx.deploy(write_project(tmp_path / name, name, {"events": str(events_file), "sleep": 2}))
    spec = cx.submit_job(name, {"workers": 1, "item_list": {"items": list(range(20)), "batch_size": 1}})

    with pytest.raises(TimeoutError):
        cx.wait_job(name, spec["job_id"], timeout=0.5)
    cx.stop_job(name, spec["job_id"])


def test_the_client_raises_the_http_apis_typed_errors(stack, tmp_path, events_file):
    cx = sluice.client(stack.url)
    name = _name()
    cx.deploy(write_project(tmp_path / name, name, {"events": str(events_file)}))

    with pytest.raises(sluice.JobNotFound) as no_job:
        cx.get_job(name, "0123456789abcdef")
    with pytest.raises(sluice.ApiNotFound):
        cx.submit_job("no-such-api", {"item_list": {"items": [1], "batch_size": 1}})
    with pytest.raises(sluice.BadRequest) as bad:
        cx.submit_job(name, {"workers": 0, "item_list": {"items": [1], "batch_size": 1}})
    with pytest.raises(sluice.ApiNotFound):
        cx.predict("no-such-api", {"x": 1})
    with pytest.raises(sluice.InvalidConfig) as invalid:
        cx.create_api({"name": _name(), "kind": "BatchAPI", "predictor": {"type": "python", "path": "missing.py"}},
                      project_dir=tmp_path / name)
    with pytest.raises(sluice.Unreachable):
        sluice.client("http://127.0.0.1:1").list_apis()

    assert (no_job.value.http_status, no_job.value.kind) == (404, "job_not_found")
    assert (bad.value.http_status, bad.value.kind) == (400, "bad_request") and "workers" in bad.value.server_message
    assert invalid.value.http_status == 400 and "missing.py" in invalid.value.server_message
    assert all(isinstance(e.value, sluice.ClientError) for e in (no_job, bad, invalid))


def test_on_job_complete_deploys_an_api_with_cortexs_python_client_against_the_sluice_running_it(
    stack, tmp_path, events_file,
):
    cx = sluice.client(stack.url)
    name, chained = _name(), _name()
    cx.deploy(write_project(tmp_path / name, name, {"events": str(events_file), "deploy_name": chained},
                            source=CHAINING_PREDICTOR))

    spec = cx.submit_job(name, {"workers": 1, "item_list": {"items": [1, 2], "batch_size": 1}})
    final = cx.wait_job(name, spec["job_id"], timeout=120)

    assert final["status"] == "status_succeeded", final
    [event] = read_events(events_file)
    assert event["deployed"] == [chained] and chained in event["listed"] and event["url"] == stack.url
    deployed = cx.get_api(chained)
    assert deployed["kind"] == "BatchAPI"
    assert deployed["spec"]["predictor"]["config"] == {"deployed_by": "on_job_complete"}


def test_create_api_takes_a_list_of_specs_and_leaves_the_folders_own_cortex_yaml_out(stack, tmp_path):
    cx = sluice.client(stack.url)
    first, second = _name(), _name()
    (tmp_path / "predictor.py").write_text(REALTIME_PREDICTOR)
    (tmp_path / "cortex.yaml").write_text(yaml.safe_dump([{"name": "ignored"}]))
    specs = [{"name": n, "kind": "BatchAPI", "predictor": {"type": "python", "path": "predictor.py"}}
             for n in (first, second)]

    deployed = cx.create_api(specs, project_dir=str(tmp_path))

    assert [api["name"] for api in deployed] == [first, second]
    assert deployed[0]["bundle"] == deployed[1]["bundle"]
    with pytest.raises(sluice.ClientError, match="predictor="):
        cx.create_api(specs[0], predictor=object, project_dir=tmp_path)
    assert json.loads(json.dumps(cx.list_apis()))  # plain JSON data
    for api in (first, second):
        cx.delete_api(api)


GATED_PREDICTOR = '''
import os, time


class PythonPredictor:
    def __init__(self, config):
        self.gate, self.started = config["gate"], config["started"]

    def predict(self, payload):
        with open(self.started, "a") as f:
            f.write("started\\n")
        give_up = time.monotonic() + 60
        while payload.get("hold") and not os.path.exists(self.gate) and time.monotonic() < give_up:
            time.sleep(0.01)
        return {"held": bool(payload.get("hold"))}
'''


def test_a_request_refused_as_overloaded_by_the_proxy_is_retried_after_retry_after(stack, tmp_path):
    """One slot, no queue: while one request holds the slot the proxy refuses the next with 503 +
    Retry-After; the client waits (here: a recorder that frees the slot instead) and tries again."""
    cx = sluice.client(stack.url)
    name = _name()
    gate, started = tmp_path / "gate", tmp_path / "started"
    (tmp_path / "predictor.py").write_text(GATED_PREDICTOR)
    cx.create_api({"name": name, "kind": "RealtimeAPI",
                   "predictor": {"type": "python", "path": "predictor.py", "max_concurrency": 1,
                                 "max_queue_length": 0, "config": {"gate": str(gate), "started": str(started)}}},
                  project_dir=tmp_path, wait=True)
    try:
        with ThreadPoolExecutor(1) as pool:
            holding = pool.submit(cx.predict, name, {"hold": True})
            _until(lambda: started.exists() and started.read_text(), 60, "the held request running")
            waits: list[float] = []

            def free_the_slot(seconds: float) -> None:
                waits.append(seconds)
                gate.touch()
                holding.result(timeout=60)

            with pytest.raises(sluice.Overloaded) as refused:
                sluice.Client(stack.url, retries=0).predict(name, {"hold": False})
            patient = sluice.Client(stack.url, retries=sluice.RetryPolicy(retries=3, sleep=free_the_slot,
                                                                          random=lambda: 0.0))
            answer = patient.predict(name, {"hold": False})

        assert refused.value.http_status == 503
        assert answer == {"held": False} and holding.result() == {"held": True}
        assert waits and waits[0] == 1.0  # the proxy's Retry-After: 1
        # The refused tries never reached the predictor: it ran the held request and the retried one.
        assert started.read_text().split() == ["started", "started"]
    finally:
        gate.touch()
        cx.delete_api(name)
