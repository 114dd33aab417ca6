"""One realtime replica process, as its callers see it: `GET` and `POST /<api>` of one API.

Most tests use Flask's test client with a predictor object injected in place of the builder;
what depends on a real HTTP server (post_predict after the answer is sent, batching over HTTP)
runs a real threaded server on a loopback port in this process. The sibling processes of a
replica are pids said to be alive (`live_pids`); real processes and a real gunicorn started
from the launcher's environment are in tests/integration/test_realtime_replica_processes.py.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from werkzeug.serving import make_server

from api.realtime import ReplicaSettings, create_replica_app, new_request_id
from foundation.api_registry import DeployedApi
from foundation.errors import BadRequest, ConfigError, ModelInputError, ModelNotFound, PredictorError
from foundation.figures import Recorder
from foundation.json_logs import JsonLinesHandler
from foundation.replica_directory import ReadinessMarkers
from predictors_runtime.config import ApiConfig
from predictors_runtime.realtime_predictor import RealtimePredictor

WAIT_S = 30.0
NOWHERE = "redis://127.0.0.1:1/0"  # no Redis listens there, and nothing here connects to it


def deployed(name: str = "iris", **predictor: Any) -> DeployedApi:
    config = ApiConfig.from_dict({"name": name, "kind": "RealtimeAPI",
                                  "predictor": {"path": "predictor.py", **predictor}})
    return DeployedApi(name=name, kind="RealtimeAPI", spec=config.to_dict(), bundle="b1", queue="cpu",
                       deployed_at=0.0, ignored_fields=[])


def replica_app(tmp_path: Path, instance: Any = None, *, build: Callable[..., RealtimePredictor] | None = None,
                wait: bool = True, client: Any = None, **predictor: Any):
    """A replica app for an API named iris whose predictor is `instance` (or what `build` makes)."""
    settings = ReplicaSettings(api=deployed(**predictor), project_dir=tmp_path, state_dir=tmp_path / "state",
                               replica_id="iris-r1")
    if build is None:
        def build(settings: ReplicaSettings, api: ApiConfig) -> RealtimePredictor:
            return RealtimePredictor(instance, client, batching=api.predictor.server_side_batching)
    # A recorder never started: the figures stay in memory, nothing is sent to Redis.
    app = create_replica_app(settings, build, configure_logging=False, recorder=Recorder.for_url(NOWHERE))
    if wait:
        assert app.extensions["sluice.replica"].wait(WAIT_S)
    return app


class LogLines:
    """The JSON lines Sluice's loggers write during a test; `wait_for` one written from another thread."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.written = threading.Condition()

    def __call__(self) -> list[dict[str, Any]]:
        with self.written:
            return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def wait_for(self, found: Callable[[list[dict[str, Any]]], Any], what: str) -> None:
        with self.written:
            assert self.written.wait_for(lambda: found(self()), WAIT_S), f"timed out waiting for {what}"


class _NotifyingHandler(JsonLinesHandler):
    def __init__(self, lines: LogLines) -> None:
        super().__init__(lines.stream)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        with self.lines.written:
            super().emit(record)
            self.lines.written.notify_all()


@pytest.fixture
def log_lines() -> Iterator[LogLines]:
    lines = LogLines()
    handler = _NotifyingHandler(lines)
    base = logging.getLogger("sluice")
    previous = base.level
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    yield lines
    base.removeHandler(handler)
    base.setLevel(previous)


@pytest.fixture
def live_pids(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The pids readiness markers count as alive: this process's, and those the test adds."""
    live = {os.getpid()}
    monkeypatch.setattr(ReadinessMarkers, "_alive", staticmethod(lambda pid: pid in live))
    return live


@pytest.fixture
def serve() -> Iterator[Callable[[Any], str]]:
    """Serve an app on a real threaded HTTP server on loopback; returns its base URL."""
    servers = []

    def start(app: Any) -> str:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()


class Echo:
    """Answers with what it was given."""

    def predict(self, payload, query_params, headers):
        return {"payload": payload, "query_params": query_params, "caller": headers.get("x-caller")}


# --- arguments by declaration ----------------------------------------------------------------


def test_predict_receives_the_payload_query_params_and_headers(tmp_path):
    client = replica_app(tmp_path, Echo()).test_client()
    response = client.post("/iris?top=3&tag=a&tag=b", json={"sepal": [5.1, 3.5]}, headers={"X-Caller": "me"})
    assert response.status_code == 200
    # query_params: a dict of strings, the last value of a repeated name winning (as in Cortex).
    assert response.get_json() == {"payload": {"sepal": [5.1, 3.5]}, "query_params": {"top": "3", "tag": "b"},
                                   "caller": "me"}


def test_predict_receives_only_the_arguments_it_declares(tmp_path):
    class OnlyHeaders:
        def predict(self, headers):
            return {"content_type": headers["content-type"], "same": headers.get("CONTENT-TYPE")}

    class Nothing:
        def handle_post(self):
            return "no arguments"

    response = replica_app(tmp_path, OnlyHeaders()).test_client().post("/iris", json={})
    assert response.get_json() == {"content_type": "application/json", "same": "application/json"}
    response = replica_app(tmp_path, Nothing()).test_client().post("/iris", data=b"ignored")
    assert response.get_data(as_text=True) == "no arguments"


def test_the_body_is_not_parsed_when_no_method_declares_payload(tmp_path):
    class IgnoresBody:
        def predict(self, query_params):
            return query_params

    response = replica_app(tmp_path, IgnoresBody()).test_client().post(
        "/iris?x=1", data=b"{not json", content_type="application/json")
    assert response.status_code == 200
    assert response.get_json() == {"x": "1"}


def test_the_body_is_parsed_when_only_post_predict_declares_payload(tmp_path):
    seen = []

    class Recorder:
        def predict(self):
            return "ok"

        def post_predict(self, payload):
            seen.append(payload)

    response = replica_app(tmp_path, Recorder()).test_client().post("/iris", json={"a": 1})
    response.close()
    assert seen == [{"a": 1}]


def test_a_predict_requiring_an_argument_sluice_does_not_offer_fails_the_build(tmp_path):
    class Wants:
        def predict(self, payload, batch_id):
            return payload

    client = replica_app(tmp_path, Wants()).test_client()
    response = client.post("/iris", json={})
    assert response.status_code == 503
    assert "batch_id" in response.get_json()["message"]


# --- payloads and responses through the app --------------------------------------------------


def test_uploaded_files_are_read_through_file_as_in_cortexs_example(tmp_path):
    class Files:
        def predict(self, payload):
            return {"text": payload["text"].file.read().decode("utf-8"),
                    "object": pickle.load(payload["object"].file),
                    "field": payload["field"]}

    client = replica_app(tmp_path, Files()).test_client()
    response = client.post("/iris", data={
        "text": (io.BytesIO("héllo".encode()), "text.txt"),
        "object": (io.BytesIO(pickle.dumps({"key": "value"})), "object.pkl"),
        "field": "plain",
    })
    assert response.get_json() == {"text": "héllo", "object": {"key": "value"}, "field": "plain"}


def test_payload_types_follow_the_content_type(tmp_path):
    class Types:
        def predict(self, payload):
            return {"type": type(payload).__name__, "value": payload if isinstance(payload, str) else None}

    client = replica_app(tmp_path, Types()).test_client()

    def kind(**kwargs) -> dict[str, Any]:
        return client.post("/iris", **kwargs).get_json()

    assert kind(data="key=value", content_type="application/x-www-form-urlencoded")["type"] == "FormPayload"
    latin = kind(data="café".encode("latin-1"), content_type="text/plain; charset=latin-1")
    assert latin == {"type": "str", "value": "café"}
    assert kind(data=b"\x00", content_type="application/octet-stream")["type"] == "bytes"
    assert kind(data=b"\x00")["type"] == "bytes"


@pytest.mark.parametrize("body, content_type, fragment", [
    (b'{"a": ', "application/json", "not valid JSON"),
    (b"\xff\xfe", "text/plain", "not valid utf-8"),
    (b"hi", "text/plain; charset=no-such-charset", "unknown charset"),
])
def test_a_payload_that_does_not_parse_is_a_400_naming_why(tmp_path, body, content_type, fragment):
    client = replica_app(tmp_path, Echo()).test_client()
    response = client.post("/iris", data=body, content_type=content_type)
    assert response.status_code == 400
    assert response.get_json()["kind"] == "bad_request"
    assert fragment in response.get_json()["message"]


def test_numpy_results_are_sent_as_json(tmp_path):
    import numpy as np

    class Numpy:
        def predict(self):
            return {"label": np.int64(1), "probabilities": np.array([0.25, 0.75], dtype=np.float32)}

    response = replica_app(tmp_path, Numpy()).test_client().post("/iris")
    assert response.get_json() == {"label": 1, "probabilities": [0.25, 0.75]}


def test_text_bytes_and_own_responses_are_sent_with_their_types(tmp_path):
    from flask import Response

    class Mixed:
        def predict(self, query_params):
            kind = query_params["kind"]
            if kind == "text":
                return "class 1"
            if kind == "bytes":
                return b"\x01\x02"
            return Response("a,b\n", status=201, mimetype="text/csv")

    client = replica_app(tmp_path, Mixed()).test_client()
    text = client.post("/iris?kind=text")
    assert (text.headers["Content-Type"], text.data) == ("text/plain; charset=utf-8", b"class 1")
    raw = client.post("/iris?kind=bytes")
    assert (raw.headers["Content-Type"], raw.data) == ("application/octet-stream", b"\x01\x02")
    own = client.post("/iris?kind=own")
    assert (own.status_code, own.mimetype, own.data) == (201, "text/csv", b"a,b\n")
    assert own.headers["X-Request-ID"]


def test_a_starlette_response_is_converted(tmp_path):
    from starlette import responses  # declared in requirements-dev.txt

    class Starlette:
        def predict(self):
            return responses.JSONResponse({"ok": True}, status_code=202, headers={"X-Model": "v1"})

    response = replica_app(tmp_path, Starlette()).test_client().post("/iris")
    assert (response.status_code, response.get_json(), response.headers["X-Model"]) == (202, {"ok": True}, "v1")


def test_a_result_that_cannot_be_sent_is_a_500_naming_its_type(tmp_path):
    class Unsendable:
        def predict(self):
            return {1, 2}

    response = replica_app(tmp_path, Unsendable()).test_client().post("/iris")
    assert response.status_code == 500
    assert response.get_json()["kind"] == "predictor_error"
    assert "set" in response.get_json()["message"]


# --- errors, request ids, logs ----------------------------------------------------------------


class Raises:
    def predict(self, query_params):
        error = query_params.get("error")
        if error == "value":
            raise ValueError("weights are missing")
        if error == "input":
            raise ModelInputError("input 'x' must have 4 columns")
        if error == "bad":
            raise BadRequest("top must be a number")
        if error == "model":
            raise ModelNotFound("no model named 'resnet'")
        return "fine"


@pytest.mark.parametrize("error, status, kind", [
    ("value", 500, "predictor_error"),
    ("input", 400, "invalid_model_input"),
    ("bad", 400, "bad_request"),
    ("model", 404, "model_not_found"),
])
def test_predictor_exceptions_map_to_statuses_and_the_process_goes_on(tmp_path, error, status, kind):
    client = replica_app(tmp_path, Raises()).test_client()
    response = client.post(f"/iris?error={error}")
    body = response.get_json()
    assert (response.status_code, body["kind"]) == (status, kind)
    assert body["request_id"] == response.headers["X-Request-ID"]
    assert client.post("/iris").data == b"fine"


def test_a_predictor_exception_is_logged_with_its_traceback_api_and_request_id(tmp_path, log_lines):
    client = replica_app(tmp_path, Raises()).test_client()
    response = client.post("/iris?error=value", headers={"X-Request-ID": "req-42"})
    assert response.get_json() == {"kind": "predictor_error", "message": "ValueError: weights are missing",
                                   "request_id": "req-42"}
    (line,) = [line for line in log_lines() if line["levelname"] == "ERROR"]
    assert line["labels"] == {"api": "iris", "request_id": "req-42"}
    assert "Traceback" in line["exception"] and "weights are missing" in line["exception"]
    assert "Traceback" not in response.get_data(as_text=True)


def test_every_answer_carries_the_callers_request_id_or_a_new_one(tmp_path):
    client = replica_app(tmp_path, Echo()).test_client()
    mine = client.post("/iris", json={}, headers={"X-Request-ID": "abc-123"})
    assert mine.headers["X-Request-ID"] == "abc-123"
    fresh = [client.post("/iris", json={}).headers["X-Request-ID"] for _ in range(3)]
    assert len(set(fresh)) == 3
    assert all(uuid.UUID(hex=rid).hex == rid and uuid.UUID(hex=rid).version == 4 for rid in fresh)
    assert client.get("/iris").headers["X-Request-ID"]
    for error in (client.post("/elsewhere"), client.put("/iris"),
                  client.post("/iris", data=b"{", content_type="application/json")):
        assert error.get_json()["request_id"] == error.headers["X-Request-ID"]


def test_new_request_ids_are_uuid4_hex():
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(uuid.UUID(hex=i).version == 4 and len(i) == 32 for i in ids)


def test_a_trailing_slash_reaches_the_api_and_other_paths_are_404(tmp_path):
    client = replica_app(tmp_path, Echo()).test_client()
    assert client.post("/iris/", json=1).status_code == 200
    assert client.get("/iris/").status_code == 200
    missing = client.post("/other")
    assert (missing.status_code, missing.get_json()["kind"]) == (404, "api_not_found")


def test_predictors_log_json_lines_labelled_with_the_request_through_either_logger(tmp_path, log_lines):
    class Logs:
        def predict(self, payload):
            from cortex_internal.lib.log import logger as cortex_logger
            from foundation.json_logs import logger

            cortex_logger.info("received payload", extra={"payload": payload})
            logger.info("predicted", extra={"label": "setosa"})
            return "ok"

    client = replica_app(tmp_path, Logs()).test_client()
    client.post("/iris", json="this movie is awesome", headers={"X-Request-ID": "r-1"})

    received, predicted = [line for line in log_lines() if line["message"] in ("received payload", "predicted")]
    assert received["payload"] == "this movie is awesome"
    assert predicted["label"] == "setosa"
    assert received["labels"] == predicted["labels"] == {"api": "iris", "request_id": "r-1"}


# --- deadlines --------------------------------------------------------------------------------


def test_a_request_arriving_past_its_deadline_is_a_504_and_predict_does_not_run(tmp_path):
    calls = []

    class Counts:
        def predict(self):
            calls.append(1)
            return "ran"

    client = replica_app(tmp_path, Counts()).test_client()
    past = str(int(time.time() * 1000) - 1)
    response = client.post("/iris", headers={"X-Sluice-Deadline-Ms": past})
    assert (response.status_code, response.get_json()["kind"]) == (504, "request_timeout")
    assert calls == []
    future = str(int(time.time() * 1000) + 60_000)
    assert client.post("/iris", headers={"X-Sluice-Deadline-Ms": future}).data == b"ran"
    assert calls == [1]


def test_a_predict_still_running_at_the_deadline_is_answered_504_then(tmp_path, log_lines):
    """request_timeout bounds wait plus run: the run gets what the queue wait left of it."""
    release, finished = threading.Event(), threading.Event()

    class Slow:
        def predict(self):
            release.wait(WAIT_S)
            finished.set()
            return "late"

    client = replica_app(tmp_path, Slow()).test_client()
    soon = str(int(time.time() * 1000) + 300)
    response = client.post("/iris", headers={"X-Sluice-Deadline-Ms": soon, "X-Request-ID": "r-late"})
    assert (response.status_code, response.get_json()["kind"]) == (504, "request_timeout")
    assert response.headers["X-Request-ID"] == "r-late"
    assert not finished.is_set()  # answered while predict was still running
    release.set()
    assert finished.wait(WAIT_S)


def test_a_malformed_deadline_is_a_400(tmp_path):
    response = replica_app(tmp_path, Echo()).test_client().post("/iris", headers={"X-Sluice-Deadline-Ms": "soon"})
    assert response.status_code == 400


# --- readiness --------------------------------------------------------------------------------


def test_a_ready_replica_says_so_and_lists_no_models_without_a_client(tmp_path):
    response = replica_app(tmp_path, Echo()).test_client().get("/iris")
    assert response.status_code == 200
    assert response.get_json() == {"ready": True, "models": []}
    assert ReadinessMarkers(tmp_path / "state").ready_count() == 1


def test_readiness_lists_the_models_and_versions_of_the_client(tmp_path):
    class Manager:
        def names(self):
            return ["a", "b"]

        def versions(self, name):
            return {"a": [1], "b": [1, 2]}[name]

    class Client:
        manager = Manager()

    response = replica_app(tmp_path, Echo(), client=Client()).test_client().get("/iris")
    assert response.get_json() == {"ready": True, "models": [{"name": "a", "versions": [1]},
                                                             {"name": "b", "versions": [1, 2]}]}


def test_requests_get_503_at_once_while_a_slow_init_runs(tmp_path):
    release = threading.Event()

    def slow_build(settings, api):
        release.wait(WAIT_S)  # a predictor whose __init__ downloads a large model
        return RealtimePredictor(Echo())

    app = replica_app(tmp_path, build=slow_build, wait=False)
    client = app.test_client()
    try:
        for answer in (client.get("/iris"), client.post("/iris", json={})):
            assert answer.status_code == 503
            assert answer.get_json()["kind"] == "not_ready"
            assert answer.headers["X-Request-ID"]
        assert not release.is_set()  # answered while __init__ was still running: nothing waited on it
        assert ReadinessMarkers(tmp_path / "state").ready_count() == 0
    finally:
        release.set()
    assert app.extensions["sluice.replica"].wait(WAIT_S)
    assert client.get("/iris").status_code == 200
    assert client.post("/iris", json=1).get_json()["payload"] == 1


def test_a_predictor_that_fails_to_build_keeps_answering_503_with_the_reason(tmp_path):
    def failing_build(settings, api):
        raise PredictorError("PythonPredictor.__init__ raised: Traceback ...\nOSError: model.pkl not found")

    client = replica_app(tmp_path, build=failing_build).test_client()
    for _ in range(2):
        for answer in (client.get("/iris"), client.post("/iris", json={})):
            assert answer.status_code == 503
            assert "model.pkl not found" in answer.get_json()["message"]
    assert "model.pkl not found" in ReadinessMarkers(tmp_path / "state").failure()


def test_a_caller_of_a_broken_replica_gets_one_line_without_the_traceback_or_the_servers_paths(tmp_path):
    traceback_text = ('importing predictor.py failed: Traceback (most recent call last):\n'
                      '  File "/srv/sluice/cache/bundles/0a1b/predictor.py", line 1, in <module>\n'
                      '    import humanize\n'
                      "ModuleNotFoundError: No module named 'humanize'")

    def failing_build(settings, api):
        raise PredictorError(traceback_text)

    client = replica_app(tmp_path, build=failing_build).test_client()
    for answer in (client.get("/iris"), client.post("/iris", json={})):
        assert answer.status_code == 503
        body = answer.get_json()
        body.pop("request_id")
        assert body == {
            "kind": "not_ready",
            "message": "building the predictor failed: importing predictor.py failed: "
                       "ModuleNotFoundError: No module named 'humanize'"}
    assert ReadinessMarkers(tmp_path / "state").failure() == traceback_text  # the whole of it, for operators


def test_a_replica_of_several_processes_is_ready_only_when_all_are(tmp_path, live_pids):
    client = replica_app(tmp_path, Echo(), processes_per_replica=2).test_client()
    waiting = client.get("/iris")
    assert waiting.status_code == 503
    assert "1 of 2 processes" in waiting.get_json()["message"]
    assert client.post("/iris", json=1).status_code == 200  # this process serves meanwhile

    other = 4_000_001  # a sibling gunicorn worker
    live_pids.add(other)
    ReadinessMarkers(tmp_path / "state").mark_ready(pid=other)
    assert client.get("/iris").get_json() == {"ready": True, "models": []}
    live_pids.discard(other)  # it died
    assert client.get("/iris").status_code == 503


def test_a_process_replacing_a_dead_one_builds_before_it_takes_requests(tmp_path, live_pids):
    """Its siblings are serving: it must not answer 503 "still being built" meanwhile."""
    sibling = 4_000_002
    live_pids.add(sibling)
    ReadinessMarkers(tmp_path / "state").mark_ready(pid=sibling)
    building, release, handed_over = threading.Event(), threading.Event(), threading.Event()
    handed_over_while_building: list[bool] = []

    def slow_build(settings, api):
        building.set()
        assert release.wait(WAIT_S)
        return RealtimePredictor(Echo())

    def watch() -> None:  # while the build is held, the app must not be handed over
        assert building.wait(WAIT_S)
        handed_over_while_building.append(handed_over.wait(0.3))
        release.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    client = replica_app(tmp_path, build=slow_build, wait=False, processes_per_replica=2).test_client()
    handed_over.set()
    watcher.join(WAIT_S)
    assert handed_over_while_building == [False]
    assert client.post("/iris", json=1).status_code == 200  # built before the app was handed over


# --- settings from the launcher's environment -------------------------------------------------------


def test_replica_settings_are_read_from_the_launchers_variables(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(deployed().to_dict()))
    settings = ReplicaSettings.from_env({
        "SLUICE_REPLICA_SPEC": str(spec), "SLUICE_REPLICA_PROJECT": str(tmp_path / "p"),
        "SLUICE_REPLICA_STATE_DIR": str(tmp_path / "s"), "SLUICE_REPLICA_ID": "iris-7",
        "SLUICE_API_URL": "http://127.0.0.1:8888", "SLUICE_CACHE_DIR": str(tmp_path / "c"),
    })
    assert settings.api == deployed()
    assert (settings.project_dir, settings.state_dir) == (tmp_path / "p", tmp_path / "s")
    assert (settings.replica_id, settings.api_url, settings.sluice.cache_dir) == (
        "iris-7", "http://127.0.0.1:8888", str(tmp_path / "c"))


def test_missing_or_unreadable_replica_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="SLUICE_REPLICA_SPEC"):
        ReplicaSettings.from_env({})
    (tmp_path / "spec.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read a deployed API"):
        ReplicaSettings.from_env({"SLUICE_REPLICA_SPEC": str(tmp_path / "spec.json"),
                                  "SLUICE_REPLICA_PROJECT": "p", "SLUICE_REPLICA_STATE_DIR": "s"})


# --- post_predict -----------------------------------------------------------------------------


def test_post_predict_receives_what_predict_returned_and_the_request(tmp_path):
    seen = []

    class Post:
        def predict(self, payload):
            return {"doubled": payload * 2}

        def post_predict(self, response, payload, query_params, headers):
            seen.append((response, payload, query_params, headers["x-caller"]))

    answer = replica_app(tmp_path, Post()).test_client().post("/iris?q=1", json=21, headers={"X-Caller": "c"})
    assert answer.get_json() == {"doubled": 42}
    answer.close()
    assert seen == [({"doubled": 42}, 21, {"q": "1"}, "c")]


def test_a_slow_post_predict_does_not_delay_the_response(tmp_path, serve):
    done = tmp_path / "post_predict_done"
    release, finished = threading.Event(), threading.Event()

    class SlowPost:
        def predict(self, payload):
            return {"got": payload}

        def post_predict(self, response):
            release.wait(WAIT_S)
            done.write_text(json.dumps(response))
            finished.set()

    url = serve(replica_app(tmp_path, SlowPost()))
    try:
        answer = requests.post(f"{url}/iris", json=7, timeout=WAIT_S)
        assert answer.json() == {"got": 7}
        assert not done.exists()  # the answer arrived while post_predict was still held
    finally:
        release.set()
    assert finished.wait(WAIT_S), "post_predict did not finish"
    assert json.loads(done.read_text()) == {"got": 7}


def test_a_raising_post_predict_still_answers_200_and_is_logged(tmp_path, serve, log_lines):
    class BrokenPost:
        def predict(self):
            return "answer"

        def post_predict(self):
            raise RuntimeError("metrics store is down")

    url = serve(replica_app(tmp_path, BrokenPost()))
    answer = requests.post(f"{url}/iris", headers={"X-Request-ID": "p-1"}, timeout=WAIT_S)
    assert (answer.status_code, answer.text) == (200, "answer")

    def logged() -> list[dict[str, Any]]:
        return [line for line in log_lines() if "metrics store is down" in line.get("exception", "")]

    log_lines.wait_for(lambda lines: logged(), "the post_predict error in the log")
    assert logged()[0]["labels"] == {"api": "iris", "request_id": "p-1"}
    assert requests.post(f"{url}/iris", timeout=WAIT_S).text == "answer"


# --- server-side batching through the app -------------------------------------------------------


def test_batched_requests_each_get_their_own_answer_over_http(tmp_path, serve):
    class Batched:
        def predict(self, payload, query_params):
            return [{"n": p["n"], "caller": q["caller"]} for p, q in zip(payload, query_params, strict=True)]

    url = serve(replica_app(tmp_path, Batched(), threads_per_process=8,
                            server_side_batching={"max_batch_size": 8, "batch_interval": "20ms"}))
    results: dict[tuple[int, int], Any] = {}

    def caller(c: int) -> None:
        with requests.Session() as session:
            for n in range(10):
                answer = session.post(f"{url}/iris?caller={c}", json={"n": n}, timeout=WAIT_S)
                results[(c, n)] = (answer.status_code, answer.json())

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 2)
    assert len(results) == 160
    assert all(status == 200 and body == {"n": n, "caller": str(c)} for (c, n), (status, body) in results.items())


def test_callers_hanging_up_mid_batch_do_not_disturb_the_others(tmp_path, serve):
    class Batched:
        def predict(self, payload):
            return [p * 10 for p in payload]

    url = serve(replica_app(tmp_path, Batched(), threads_per_process=8,
                            server_side_batching={"max_batch_size": 8, "batch_interval": 0.05}))
    answers: dict[int, Any] = {}

    def caller(n: int) -> None:
        quitter = n % 3 == 0  # gives up long before its batch window closes
        try:
            answer = requests.post(f"{url}/iris", json=n, timeout=(WAIT_S, 0.005 if quitter else WAIT_S))
            answers[n] = answer.json()
        except requests.Timeout:
            answers[n] = "hung up"

    for round_ in range(4):
        threads = [threading.Thread(target=caller, args=(round_ * 100 + i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 2)
    assert len(answers) == 48
    for n, answer in answers.items():
        assert answer == n * 10 or (n % 3 == 0 and answer == "hung up"), (n, answer)


def test_a_batched_predict_returning_a_short_list_answers_500_to_every_request(tmp_path, serve):
    class Short:
        def predict(self, payload):
            return payload[:-1]

    url = serve(replica_app(tmp_path, Short(), threads_per_process=4,
                            server_side_batching={"max_batch_size": 4, "batch_interval": 0.05}))
    answers: list[requests.Response] = []
    threads = [threading.Thread(target=lambda: answers.append(requests.post(f"{url}/iris", json=1, timeout=WAIT_S)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 2)
    assert len(answers) == 4
    assert all(a.status_code == 500 and a.json()["kind"] == "predictor_error" for a in answers)
    assert all("results for a batch of" in a.json()["message"] for a in answers)


# A real gunicorn started as the launcher starts it: tests/integration/test_realtime_replica_processes.py.


def test_a_replica_loads_the_latest_version_of_its_models_before_it_is_ready(tmp_path):
    """Routed once ready, a replica's first requests must not pay for downloads and loads."""
    from predictors_runtime.clients import PythonClient
    from predictors_runtime.config import ModelsConfig
    from predictors_runtime.models.manager import ModelManager

    for name, versions in (("a", (1, 2)), ("b", (1,)), ("c", (1,))):
        for version in versions:
            folder = tmp_path / "models" / name / str(version)
            folder.mkdir(parents=True)
            (folder / "model.txt").write_text(f"{name}{version}")
    (tmp_path / "models" / "empty").mkdir()  # no version yet: skipped, served once one appears
    loads: list[str] = []
    models = ModelsConfig(dir=str(tmp_path / "models"), cache_size=2)
    client = PythonClient(lambda load: ModelManager(models, "python", tmp_path / "cache", load, poll_interval_s=3600))
    client.bind(lambda path: loads.append(Path(path).read_text() if Path(path).is_file() else
                                          (Path(path) / "model.txt").read_text()))
    app = replica_app(tmp_path, Echo(), client=client, models={"dir": str(tmp_path / "models"), "cache_size": 2})
    assert app.test_client().get("/iris").status_code == 200
    assert loads == ["a2", "b1"]  # the latest of as many models as the memory cache holds
