"""Realtime APIs end to end: deploy, and the API answers at the public URL through the proxy.

On the session's realtime stack (haproxy on the public port, gunicorn replicas started by
launchers), with its bundles on the session's S3 server so that a second `sluice serve` with its
own working folder, as another host would run it, can fetch them too. Each test deletes the APIs
it deployed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
import requests
import yaml

from foundation.replica_directory import RedisReplicaDirectory, ReplicaDirectory
from predictors_runtime.models import DEFAULT_MODEL_NAME
from sluice.client import ApiNotFound, Client, ClientError
from sluice.embedded import Stack, free_port
from testbed.waiting import wait_for

from .conftest import closing_client
from .processes import children_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Answers with who served the request: the replica, its process, its environment and files.
REALTIME_PREDICTOR = '''
import json, os, time

import helpers


class PythonPredictor:
    def __init__(self, config):
        self.config = config
        gate = config.get("gate")
        while gate and not os.path.exists(gate):  # a slow __init__, until the test opens the gate
            time.sleep(0.05)

    def predict(self, payload, query_params, headers):
        if isinstance(payload, dict) and payload.get("fail"):
            raise ValueError("cannot handle this payload")
        return {
            "echo": payload, "query": query_params, "request_id": headers.get("X-Request-ID"),
            "pid": os.getpid(), "replica": os.environ.get("SLUICE_REPLICA_ID"),
            "host": os.environ.get("HOST_LABEL"), "greeting": os.environ.get("GREETING"),
            "from_predictor_env": os.environ.get("FROM_PREDICTOR_ENV"), "helper": helpers.NAME,
            "version": "{version}", "cwd": os.getcwd(), "api_url": os.environ.get("SLUICE_API_URL"),
        }
'''

# A python predictor with a model folder shipped in the project.
MODEL_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config, python_client):
        self.client = python_client

    def load_model(self, model_path):
        with open(model_path + "/weights.txt") as f:
            return f.read().strip()

    def predict(self, payload):
        return {"weights": self.client.get_model()}
'''


def write_realtime_project(
    folder: Path, api_name: str, config: dict[str, Any] | None = None, *, helper: str = "default",
    dotenv: str | None = None, source: str | None = None, version: str = "v1",
    predictor_extra: dict[str, Any] | None = None, files: dict[str, str] | None = None,
) -> Path:
    """A Cortex-style RealtimeAPI project folder; returns the path of its cortex.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(source or REALTIME_PREDICTOR.replace("{version}", version))
    (folder / "helpers.py").write_text(f"NAME = {helper!r}\n")
    if dotenv is not None:
        (folder / ".env").write_text(dotenv)
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    predictor = {"type": "python", "path": "predictor.py", "config": config or {}, **(predictor_extra or {})}
    api = {"name": api_name, "kind": "RealtimeAPI", "predictor": predictor, "autoscaling": {"min_replicas": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


@pytest.fixture(scope="module")
def s3_storage(realtime_storage: str) -> str:
    return realtime_storage


@pytest.fixture(scope="module")
def rt_stack(realtime_stack: Stack) -> Stack:
    """The session's realtime stack: the proxy, the management API and the replica manager, bundles
    on S3; no batch workers are needed here."""
    return realtime_stack


@pytest.fixture(scope="module")
def rt_client(rt_stack: Stack) -> Client:
    return closing_client(rt_stack.url, timeout=30)


@pytest.fixture(scope="module")
def replicas(rt_stack: Stack) -> ReplicaDirectory:
    return RedisReplicaDirectory(redis.Redis.from_url(rt_stack.redis_url or ""))


@pytest.fixture
def deploy_realtime(rt_client: Client, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Write and deploy a realtime project under a fresh API name; returns the name. The APIs a
    test deployed are deleted after it (their replicas stop), unless the test deleted them itself."""
    deployed: list[str] = []

    def deploy(config: dict[str, Any] | None = None, name: str | None = None, **kwargs: Any) -> str:
        api_name = name or f"rt-{uuid.uuid4().hex[:8]}"
        rt_client.deploy(write_realtime_project(tmp_path / api_name, api_name, config, **kwargs))
        if api_name not in deployed:
            deployed.append(api_name)
        return api_name

    yield deploy
    delete_apis(rt_client, deployed)


def delete_apis(client: Client, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(ApiNotFound):  # the test deleted it itself
            client.delete_api(name)



def test_a_deployed_realtime_api_answers_json_at_the_public_url(rt_stack, rt_client, deploy_realtime, replicas):
    name = deploy_realtime(dotenv="GREETING=hello from .env\n",
                           predictor_extra={"env": {"FROM_PREDICTOR_ENV": "yes"}})
    rt_client.wait_ready(name, timeout=120)

    response = requests.post(f"{rt_stack.url}/{name}?lang=en", json={"text": "hi"}, timeout=30)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["echo"] == {"text": "hi"} and body["query"] == {"lang": "en"}
    assert response.headers["X-Request-ID"] == body["request_id"]
    assert body["greeting"] == "hello from .env" and body["from_predictor_env"] == "yes"
    assert body["api_url"] == rt_stack.url
    assert Path(body["cwd"]).is_dir() and (Path(body["cwd"]) / "predictor.py").is_file()

    mine = requests.post(f"{rt_stack.url}/{name}", json={}, headers={"X-Request-ID": "my-request-1"}, timeout=30)
    assert mine.headers["X-Request-ID"] == "my-request-1" and mine.json()["request_id"] == "my-request-1"
    assert rt_client.predict(name, [1, 2])["echo"] == [1, 2]

    described = rt_client.api(name)
    assert described["kind"] == "RealtimeAPI" and described["ignored_fields"] == []
    assert described["spec"]["autoscaling"]["min_replicas"] == 1  # read, with Cortex's defaults for the rest
    assert described["spec"]["autoscaling"]["target_replica_concurrency"] == 1
    (replica,) = described["replicas"]
    assert replica["ready"] and not replica["draining"] and replica["bundle"] == described["bundle"]
    assert replica["id"] == body["replica"]
    assert [r.replica_id for r in replicas.live(time.time(), name)] == [replica["id"]]


def test_get_says_the_api_is_ready_and_which_models_it_holds(rt_client, deploy_realtime):
    name = deploy_realtime(source=MODEL_PREDICTOR, predictor_extra={"models": {"path": "model"}},
                           files={"model/weights.txt": "0.25\n"})
    readiness = rt_client.wait_ready(name, timeout=120)
    assert readiness["ready"] is True
    assert readiness["models"] == [{"name": DEFAULT_MODEL_NAME, "versions": readiness["models"][0]["versions"]}]
    assert rt_client.predict(name, {})["weights"] == "0.25"


def test_while_the_predictor_builds_get_and_post_answer_not_ready_at_once(rt_stack, rt_client, deploy_realtime,
                                                                           tmp_path, replicas):
    gate = tmp_path / "gate"
    name = deploy_realtime({"gate": str(gate)})
    # The launcher starts the replica; its process builds (and waits at the gate) in the background.
    wait_for(lambda: replicas.live(time.time(), name), 60, "the replica's first heartbeat")
    for method in ("GET", "POST"):
        response = requests.request(method, f"{rt_stack.url}/{name}", json={}, timeout=10)
        assert response.status_code == 503, response.text
        assert response.json()["kind"] == "not_ready" and response.headers.get("X-Request-ID")
    assert not rt_client.api(name)["replicas"][0]["ready"]

    gate.write_text("open")
    assert rt_client.wait_ready(name, timeout=60)["ready"] is True
    assert rt_client.predict(name, {"n": 1})["echo"] == {"n": 1}


def test_two_realtime_apis_each_see_only_their_own_env_and_modules(rt_client, deploy_realtime):
    first = deploy_realtime(helper="first helpers.py", dotenv="GREETING=first\n")
    second = deploy_realtime(helper="second helpers.py", dotenv="GREETING=second\n")
    rt_client.wait_ready(first, timeout=120)
    rt_client.wait_ready(second, timeout=120)
    for _ in range(3):
        a, b = rt_client.predict(first, {}), rt_client.predict(second, {})
        assert (a["helper"], a["greeting"]) == ("first helpers.py", "first")
        assert (b["helper"], b["greeting"]) == ("second helpers.py", "second")
        assert a["pid"] != b["pid"] and a["cwd"] != b["cwd"]


def test_a_predictor_exception_is_a_500_and_the_api_keeps_serving(rt_stack, rt_client, deploy_realtime):
    name = deploy_realtime()
    rt_client.wait_ready(name, timeout=120)
    failed = requests.post(f"{rt_stack.url}/{name}", json={"fail": True}, timeout=30)
    assert failed.status_code == 500
    assert failed.json()["kind"] == "predictor_error" and "cannot handle this payload" in failed.json()["message"]
    assert failed.headers["X-Request-ID"] == failed.json()["request_id"]
    assert rt_client.predict(name, {"fine": True})["echo"] == {"fine": True}


# How Cortex projects told a JSON object from a form (starlette's FormData is no dict).
FORM_OR_JSON_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config):
        pass

    def predict(self, payload):
        if isinstance(payload, dict):
            return {"json": sorted(payload)}
        fields = {name: payload[name] for name in payload if isinstance(payload[name], str)}
        files = {name: [payload[name].filename, payload[name].content_type, payload[name].file.read().decode()]
                 for name in payload if not isinstance(payload[name], str)}
        return {"form": fields, "tags": payload.getlist("tag"), "files": files}
'''


def test_a_cortex_predictor_tells_forms_from_json_objects_as_it_did_on_cortex(rt_stack, rt_client, deploy_realtime):
    name = deploy_realtime(source=FORM_OR_JSON_PREDICTOR)
    rt_client.wait_ready(name, timeout=120)
    url = f"{rt_stack.url}/{name}"

    as_json = requests.post(url, json={"tag": "a", "name": "iris"}, timeout=30)
    urlencoded = requests.post(url, data="tag=a&name=iris&tag=b", timeout=30,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
    multipart = requests.post(url, data={"name": "iris"}, timeout=30,
                              files={"rows": ("rows.csv", b"1,2,3", "text/csv")})

    assert as_json.json() == {"json": ["name", "tag"]}
    assert urlencoded.json() == {"form": {"tag": "b", "name": "iris"}, "tags": ["a", "b"], "files": {}}
    assert multipart.json() == {"form": {"name": "iris"}, "tags": [],
                                "files": {"rows": ["rows.csv", "text/csv", "1,2,3"]}}


def test_a_batch_apis_own_path_at_the_public_address_takes_reads_and_stops_jobs_as_on_cortex(
        rt_stack, rt_client, tmp_path, request):
    from .conftest import write_project

    name = f"batch-{uuid.uuid4().hex[:8]}"
    rt_client.deploy(write_project(tmp_path / name, name))
    request.addfinalizer(lambda: delete_apis(rt_client, [name]))
    endpoint = f"{rt_stack.url}/{name}"
    # Cortex's curl lines with only the host changed (this stack runs no worker: the job waits)
    submitted = requests.post(endpoint, json={"workers": 1, "item_list": {"items": [1, 2, 3], "batch_size": 2}},
                              timeout=30)
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["job_id"]

    read = requests.get(endpoint, params={"jobID": job_id}, timeout=30).json()
    stopped = requests.delete(endpoint, params={"jobID": job_id}, timeout=30)

    assert read["endpoint"] == endpoint and read["api_spec"]["name"] == name
    assert read["job_status"]["job_id"] == job_id and read["job_status"]["total_batch_count"] == 2
    assert stopped.status_code == 200 and stopped.json() == {"message": f"stopped job {job_id}"}
    assert rt_client.job(name, job_id)["status"] == "status_stopped"
    assert rt_client.get_api(name)["endpoint"] == endpoint


def test_an_unknown_api_is_a_404_and_reserved_paths_keep_their_meaning(rt_stack):
    response = requests.post(f"{rt_stack.url}/no-such-api", json={}, timeout=30)
    assert response.status_code == 404 and response.json()["kind"] == "api_not_found"
    assert requests.get(f"{rt_stack.url}/healthz", timeout=30).json()["status"] == "ok"
    assert requests.post(f"{rt_stack.url}/healthz", timeout=30).status_code == 405
    assert requests.get(f"{rt_stack.url}/apis", timeout=30).status_code == 200


def test_deleting_a_realtime_api_stops_its_replicas(rt_stack, rt_client, deploy_realtime, replicas):
    name = deploy_realtime()
    rt_client.wait_ready(name, timeout=120)
    served_by = rt_client.predict(name, {})["pid"]
    (running,) = rt_stack.replicas.running(name)
    launcher = running.process

    rt_client.delete_api(name)
    assert launcher.wait(timeout=60) == 0
    assert replicas.live(time.time(), name) == []
    wait_for(lambda: requests.post(f"{rt_stack.url}/{name}", json={}, timeout=30).status_code == 404, 30,
             "the proxy forgetting the deleted API")
    assert requests.post(f"{rt_stack.url}/{name}", json={}, timeout=30).json()["kind"] == "api_not_found"
    with pytest.raises(ProcessLookupError):
        os.kill(served_by, 0)


def test_a_redeploy_switches_to_the_new_version_without_failing_a_request(rt_stack, rt_client, deploy_realtime,
                                                                          tmp_path):
    name = deploy_realtime(version="v1")
    rt_client.wait_ready(name, timeout=120)
    before = rt_client.predict(name, {})["replica"]
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def hammer() -> None:
        session = requests.Session()
        while not stop.is_set():
            response = session.post(f"{rt_stack.url}/{name}", json={}, timeout=60)
            answers.append((response.status_code, response.json().get("version", response.text)))

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        rt_client.deploy(write_realtime_project(tmp_path / name, name, version="v2"))
        wait_for(lambda: answers and answers[-1][1] == "v2", 120, "answers from the new version")
        wait_for(lambda: [r["id"] for r in rt_client.api(name)["replicas"]] != [before]
                 and len(rt_client.api(name)["replicas"]) == 1, 60, "the old replica going away")
        count = len(answers)
        wait_for(lambda: len(answers) > count + 5, 30, "more answers")
    finally:
        stop.set()
        thread.join()
    assert {status for status, _ in answers} == {200}, [a for a in answers if a[0] != 200][:5]
    versions = [version for _, version in answers]
    # Both versions serve while the old replica drains; once it is gone, only the new one answers.
    assert "v1" in versions and set(versions[count:]) == {"v2"}


def test_a_second_host_running_sluice_serve_gets_traffic_through_the_proxy(
    rt_stack, rt_client, deploy_realtime, replicas, s3_storage, tmp_path,
):
    name = deploy_realtime()
    rt_client.wait_ready(name, timeout=120)
    host2 = tmp_path / "host2"
    host2.mkdir()
    env = {
        **os.environ, "SLUICE_REDIS_URL": rt_stack.redis_url or "", "SLUICE_STORAGE": s3_storage,
        "SLUICE_CACHE_DIR": str(host2 / "cache"), "SLUICE_API_URL": rt_stack.url, "HOST_LABEL": "host2",
        "PYTHONPATH": str(ROOT),
    }
    port = free_port()
    with open(host2 / "serve.log", "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "serve", name, "--port", str(port), "--host", "127.0.0.1"],
            env=env, cwd=host2, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: len(replicas.routable(time.time(), name)) == 2, 120,
                 f"two ready replicas ({(host2 / 'serve.log').read_text()[-2000:]})")
        assert any(r.port == port for r in replicas.routable(time.time(), name))
        assert (host2 / "cache" / "bundles").is_dir()  # fetched from S3 into the host's own cache

        hosts: set[str | None] = set()

        def both_hosts_answered() -> bool:
            hosts.add(rt_client.predict(name, {})["host"])
            return hosts == {None, "host2"}

        wait_for(both_hosts_answered, 60, "answers from both hosts")

        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 0
        assert all(r.port != port for r in replicas.live(time.time(), name))
        for _ in range(5):
            assert rt_client.predict(name, {})["host"] is None
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


# Answers which of the splitter's two APIs served the request.
WHO_PREDICTOR = """
class PythonPredictor:
    def __init__(self, config):
        self.who = config["who"]

    def predict(self, payload):
        return {"who": self.who, "echo": payload}
"""


def test_a_cortex_traffic_splitter_shares_requests_30_70_and_get_shows_what_each_api_was_sent(
        rt_stack, rt_client, tmp_path):
    tag = uuid.uuid4().hex[:6]
    onnx, tf, iris = f"iris-onnx-{tag}", f"iris-tf-{tag}", f"iris-{tag}"
    (tmp_path / "predictor.py").write_text(WHO_PREDICTOR)
    apis = [{"name": name, "kind": "RealtimeAPI", "predictor": {"type": "python", "path": "predictor.py",
                                                                 "config": {"who": name}}}
            for name in (onnx, tf)]
    splitter = {"name": iris, "kind": "TrafficSplitter", "networking": {"endpoint": iris},
                "apis": [{"name": onnx, "weight": 30}, {"name": tf, "weight": 70}]}
    (tmp_path / "cortex.yaml").write_text(yaml.safe_dump([*apis, splitter], sort_keys=False))
    try:
        deployed = {api["name"]: api for api in rt_client.deploy(tmp_path / "cortex.yaml")}
        assert deployed[iris]["kind"] == "TrafficSplitter" and deployed[iris]["ignored_fields"] == ["networking"]
        for name in (onnx, tf):
            rt_client.wait_ready(name, timeout=120)
        with requests.Session() as session:
            answers = [session.post(f"{rt_stack.url}/{iris}", json={"n": n}, timeout=30) for n in range(1000)]
        assert {answer.status_code for answer in answers} == {200}, answers[0].text
        served = {name: sum(1 for a in answers if a.json()["who"] == name) for name in (onnx, tf)}
        assert abs(served[onnx] - 300) <= 30 and served[onnx] + served[tf] == 1000, served

        def split() -> dict[str, dict[str, Any]]:
            return {part["api"]: part for part in rt_client.api(iris)["split"]}
        wait_for(lambda: {name: part["sent"] for name, part in split().items()} == served, 20,
                 "the proxy's counts of what each API was sent")
        assert {name: (part["weight"], part["state"]) for name, part in split().items()} == {
            onnx: (30, "ready"), tf: (70, "ready")}
        assert split()[onnx]["share"] == pytest.approx(served[onnx] / 1000)

        shown = _cli(rt_stack.url, "get", iris)
        assert shown.returncode == 0, shown.stderr
        assert "TrafficSplitter" in shown.stdout and onnx in shown.stdout and "30%" in shown.stdout
        listed = _cli(rt_stack.url, "get")
        assert f"30% {onnx}, 70% {tf}" in listed.stdout, listed.stdout

        # An API a splitter shares requests with is not deleted from under it; a splitter naming an API
        # that is not a deployed RealtimeAPI is refused, naming it.
        with pytest.raises(ClientError) as refused:
            rt_client.delete_api(onnx)
        assert refused.value.http_status == 409 and iris in refused.value.server_message
        missing = dict(splitter, apis=[{"name": onnx, "weight": 50}, {"name": f"iris-xgb-{tag}", "weight": 50}])
        (tmp_path / "cortex.yaml").write_text(yaml.safe_dump([missing], sort_keys=False))
        with pytest.raises(ClientError) as refused:
            rt_client.deploy(tmp_path / "cortex.yaml")
        assert f"apis[1].name: iris-xgb-{tag} is not a deployed RealtimeAPI" in refused.value.server_message
    finally:
        delete_apis(rt_client, [iris, onnx, tf])


def test_a_cortex_grpc_api_is_called_through_the_public_address_with_the_projects_own_stubs(
        rt_stack, rt_client, tmp_path):
    from tests.integration.test_grpc_replica import IRIS_HANDLER, IRIS_PROTO, stubs_of

    name = "iris-classifier"  # the package in its .proto is the name with - spelled _, as on Cortex
    project = tmp_path / "project"
    project.mkdir()
    (project / "iris_classifier.proto").write_text(IRIS_PROTO)
    (project / "handler.py").write_text(IRIS_HANDLER)
    api = {"name": name, "kind": "RealtimeAPI", "handler": {
        "type": "python", "path": "handler.py", "protobuf_path": "iris_classifier.proto", "threads_per_process": 4,
        "config": {"labels": ["setosa", "versicolor", "virginica"]}}}
    (project / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    messages, stubs = stubs_of(project / "iris_classifier.proto", tmp_path / "client")
    try:
        [deployed] = rt_client.deploy(project / "cortex.yaml")
        assert "warnings" not in deployed  # the generated iris_classifier_pb2 is not a missing package
        rt_client.wait_ready(name, timeout=120)
        # Cortex's gRPC client example, as written: the endpoint and port from get_api.
        described = rt_client.get_api(name)
        grpc_endpoint = described["endpoint"] + ":" + str(described["grpc_ports"]["insecure"])
        assert grpc_endpoint == rt_stack.url.split("://", 1)[1]
        channel = grpc.insecure_channel(grpc_endpoint)
        try:
            stub = stubs.HandlerStub(channel)
            sample = messages.Sample(sepal_length=5.2, sepal_width=3.6, petal_length=1.4, petal_width=0.3)
            answer, call = stub.Predict.with_call(sample, timeout=30)
            assert answer.classification == "setosa"
            assert len(dict(call.initial_metadata())["x-request-id"]) == 36  # made by the proxy, as for HTTP
            assert [n.value for n in stub.Count(messages.Upto(n=3), timeout=30)] == [1, 2, 3]
            with pytest.raises(grpc.RpcError) as failed:
                stub.Explain(sample, timeout=30)
            assert failed.value.code() == grpc.StatusCode.INTERNAL
        finally:
            channel.close()
        # Its own path says it is ready (for sluice get and the client); a JSON body there is refused.
        assert requests.get(f"{rt_stack.url}/{name}", timeout=30).json() == {"ready": True, "models": []}
        refused = requests.post(f"{rt_stack.url}/{name}", json={}, timeout=30)
        assert refused.status_code == 400 and "served over gRPC" in refused.json()["message"]
        shown = _cli(rt_stack.url, "get", name)
        assert "methods at /iris_classifier.<Service>/<Method>" in shown.stdout, shown.stdout + shown.stderr

        # A TrafficSplitter shares HTTP requests only, as on Cortex.
        splitter = {"name": "iris-split", "kind": "TrafficSplitter", "apis": [{"name": name, "weight": 100}]}
        (project / "cortex.yaml").write_text(yaml.safe_dump([splitter], sort_keys=False))
        with pytest.raises(ClientError) as split:
            rt_client.deploy(project / "cortex.yaml")
        assert f"{name} is served over gRPC; a TrafficSplitter shares only HTTP requests" in \
            split.value.server_message
    finally:
        delete_apis(rt_client, [name])


def test_a_grpc_proto_that_breaks_cortexs_rules_is_refused_at_deploy_naming_the_rule(rt_client, tmp_path):
    (tmp_path / "handler.py").write_text("class Handler:\n    pass\n")
    api = {"name": "iris-grpc", "kind": "RealtimeAPI", "handler": {"path": "handler.py",
                                                                    "protobuf_path": "iris.proto"}}
    (tmp_path / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    for proto, said in [
        ('syntax = "proto3";\npackage iris;\nservice S { rpc P (M) returns (M); }\nmessage M {}\n',
         "iris.proto must declare `package iris_grpc;` (the API's name with - spelled _), as on Cortex "
         "(it declares package iris)"),
        ('syntax = "proto3";\npackage iris_grpc;\nmessage M {}\n', "iris.proto must define exactly one service "
         "(it defines 0)"),
        ('syntax = "proto3";\npackage iris_grpc;\nmessage M { strin a = 1; }\n',
         "iris.proto does not compile: iris.proto:3"),
    ]:
        (tmp_path / "iris.proto").write_text(proto)
        with pytest.raises(ClientError) as refused:
            rt_client.deploy(tmp_path / "cortex.yaml")
        assert refused.value.http_status == 400
        assert f"api iris-grpc: predictor.protobuf_path: {said}" in refused.value.server_message


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "--url", url, *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


def test_predicting_with_the_client_raises_the_servers_error(rt_client, deploy_realtime):
    name = deploy_realtime()
    rt_client.wait_ready(name, timeout=120)
    with pytest.raises(ClientError) as raised:
        rt_client.predict(name, {"fail": True})
    assert raised.value.http_status == 500 and raised.value.kind == "predictor_error"
    with pytest.raises(ClientError) as missing:
        rt_client.wait_ready("no-such-api", timeout=5)
    assert missing.value.http_status == 404
    assert rt_client.predict(name, "text")["echo"] == "text"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_sluice_up_runs_a_replica_per_realtime_api_and_ctrl_c_stops_it(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_REDIS_URL"}
    env.update(SLUICE_STORAGE=str(tmp_path / "storage"), SLUICE_CACHE_DIR=str(tmp_path / "cache"))
    up = subprocess.Popen([sys.executable, "-m", "sluice.cli", "up", "--port", str(port), "--workers", "0",
                           "--data-dir", str(tmp_path / "home")],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        url = up.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}"
        client = closing_client(url)
        deployed = subprocess.run(
            [sys.executable, "-m", "sluice.cli", "--url", url, "deploy",
             str(write_realtime_project(tmp_path / "project", "greeter"))],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=120,
        )
        assert deployed.returncode == 0, deployed.stderr
        assert "deployed greeter (RealtimeAPI, at /greeter" in deployed.stdout
        client.wait_ready("greeter", timeout=120)
        answer = client.predict("greeter", {"hello": "world"})
        assert answer["echo"] == {"hello": "world"}
        assert client.api("greeter")["replicas"][0]["id"] == answer["replica"]
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=90) == 0, up.stderr.read()
    assert not _alive(answer["pid"])  # the replica's process stopped with the stack
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/healthz", timeout=5)


def test_a_launcher_killed_outright_takes_its_gunicorn_with_it(rt_stack, rt_client, deploy_realtime, replicas,
                                                                tmp_path):
    name = deploy_realtime()
    env = {**os.environ, "SLUICE_REDIS_URL": rt_stack.redis_url or "", "SLUICE_CACHE_DIR": str(tmp_path / "cache"),
           **{k: v for k, v in rt_stack.env.items() if k.startswith("SLUICE_")}}
    port = free_port()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "serve", name, "--port", str(port)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: any(r.port == port and r.ready for r in replicas.live(time.time(), name)), 120,
                 "the hand-started replica being ready")
        (arbiter,) = children_of(launcher.pid)
        workers = children_of(arbiter)
        assert workers
    finally:
        launcher.kill()
        launcher.wait()
    wait_for(lambda: not any(_alive(pid) for pid in [arbiter, *workers]), 60, "gunicorn stopping")
    rt_client.wait_ready(name, timeout=120)  # the stack's own replica serves on
    assert rt_client.predict(name, {})["echo"] == {}
