"""An AsyncAPI request on a worker node, with the in-memory request store, nodes and registry."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from foundation.api_registry import DeployedApi
from foundation.errors import BadRequest, PredictorError
from foundation.memory import MemoryApiRegistry
from jobs.async_objects import RequestObjects
from jobs.async_request import AsyncRequest, PayloadKind, RequestStatus, check_payload, payload_kind
from jobs.async_runner import AsyncPredictors, AsyncRuntime
from jobs.delivery import Delivery, request_entry
from jobs.memory_async import MemoryAsyncRequests
from jobs.memory_nodes import MemoryNodes
from jobs.memory_queues import MemoryJobQueues
from jobs.nodes import jobs_held
from jobs.settle import settle_deliveries
from jobs.store.memory import MemoryJobStore
from jobs.time_limit import EXIT_STOPPED_BATCH
from predictors_runtime.async_predictor import AsyncPredictor
from predictors_runtime.config import ApiConfig, parse_api_configs


class Predictor:
    def __init__(self, predict: Any) -> None:
        self._predict = predict
        self.closed = False

    def predict(self, payload: Any, request_id: str) -> Any:
        return self._predict(payload, request_id)

    def close(self) -> None:
        self.closed = True


class Builder:
    def __init__(self, predict: Any) -> None:
        self.predict = predict
        self.built: list[Predictor] = []

    def build(self, deployed: DeployedApi) -> Predictor:
        if self.predict is None:
            raise PredictorError("PythonPredictor.__init__ raised: RuntimeError: corrupt model")
        self.built.append(Predictor(self.predict))
        return self.built[-1]

    def discard(self, deployed: DeployedApi) -> None:
        pass


class Ending:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.ended = threading.Event()

    def __call__(self, status: int) -> None:
        self.statuses.append(status)
        self.ended.set()


def api_config(**predictor: Any) -> ApiConfig:
    return ApiConfig.model_validate({"name": "echo", "kind": "AsyncAPI",
                                     "predictor": {"path": "predictor.py", **predictor}})


class Harness:
    def __init__(self, tmp_path: Path, predict: Any, **predictor: Any) -> None:
        self.requests = MemoryAsyncRequests()
        self.objects = RequestObjects(str(tmp_path / "storage"))
        self.registry = MemoryApiRegistry()
        self.registry.put(api_config(**predictor), "bundle-1", now=1.0)
        self.nodes = MemoryNodes(node_ttl_s=10)
        self.builder = Builder(predict)
        self.ending = Ending()
        self.runtime = AsyncRuntime(self.requests, self.objects, self.registry, self.nodes,
                                    AsyncPredictors(self.builder), end_process=self.ending, clock=lambda: 50.0)

    def submit(self, request_id: str, body: bytes, kind: PayloadKind = PayloadKind.JSON) -> None:
        self.requests.create(AsyncRequest("echo", request_id, RequestStatus.IN_QUEUE, kind, 10.0, payload=body), 10.0)

    def record(self, request_id: str) -> AsyncRequest:
        record = self.requests.get("echo", request_id)
        assert record is not None
        return record


def test_a_request_runs_once_per_delivery_and_its_result_is_stored(tmp_path: Path) -> None:
    seen: list[tuple[Any, str]] = []
    h = Harness(tmp_path, lambda payload, request_id: seen.append((payload, request_id)) or {"ok": payload})
    h.submit("r1", b'{"a": 1}')
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    record = h.record("r1")
    assert record.status is RequestStatus.COMPLETED and record.timestamp == 50.0
    assert h.objects.read(record.result_uri) == b'{"ok": {"a": 1}}'
    assert seen == [({"a": 1}, "r1")]
    assert h.nodes.inflight("node-a") == {}  # the delivery left the node's in-flight hash


def test_a_second_delivery_of_an_ended_request_runs_nothing_and_records_nothing(tmp_path: Path) -> None:
    calls: list[str] = []
    h = Harness(tmp_path, lambda payload, request_id: calls.append(request_id) or len(calls))
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1")
    first = h.record("r1")
    h.runtime.run_request("echo", "r1")  # the message given back after its node died, say
    assert calls == ["r1"] and h.record("r1") == first


def test_the_predictor_is_built_once_per_api_version_and_the_old_one_closed(tmp_path: Path) -> None:
    h = Harness(tmp_path, lambda payload, request_id: payload)
    for request_id in ("r1", "r2"):
        h.submit(request_id, b"1")
        h.runtime.run_request("echo", request_id)
    assert len(h.builder.built) == 1
    h.registry.put(api_config(), "bundle-2", now=2.0)
    h.submit("r3", b"1")
    h.runtime.run_request("echo", "r3")
    assert len(h.builder.built) == 2 and h.builder.built[0].closed and not h.builder.built[1].closed


def test_a_predict_that_raises_fails_the_request_with_one_line(tmp_path: Path) -> None:
    def predict(payload: Any, request_id: str) -> Any:
        raise ValueError("bad\ninput")

    h = Harness(tmp_path, predict)
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1")
    assert h.record("r1").status is RequestStatus.FAILED and h.record("r1").message == "ValueError: bad input"


def test_a_predictor_that_cannot_be_built_fails_the_request_saying_why(tmp_path: Path) -> None:
    h = Harness(tmp_path, None)
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1")
    assert h.record("r1").message == ("building the predictor failed: PythonPredictor.__init__ raised: "
                                      "RuntimeError: corrupt model")


def test_a_result_json_cannot_hold_fails_naming_its_type(tmp_path: Path) -> None:
    h = Harness(tmp_path, lambda payload, request_id: object())
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1")
    assert h.record("r1").message.startswith("predict returned a object, which is not JSON-serialisable")


def test_a_request_past_its_timeout_is_failed_then_its_process_ended(tmp_path: Path) -> None:
    ending = threading.Event()

    def predict(payload: Any, request_id: str) -> Any:
        ending.wait(30)  # released once the (stubbed) end of the process comes
        return "too late"

    h = Harness(tmp_path, predict, request_timeout=0.05)
    h.ending = ending_stub = Ending()
    h.runtime._end_process = lambda status: (ending_stub(status), ending.set())
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert ending_stub.statuses == [EXIT_STOPPED_BATCH]
    record = h.record("r1")
    assert record.status is RequestStatus.FAILED and record.message == "timed out after 0.05 s"
    assert record.result_uri == ""  # the late result is not recorded


def test_payload_kinds_follow_the_content_type() -> None:
    assert payload_kind("application/json; charset=utf-8") is PayloadKind.JSON
    assert payload_kind("text/plain") is PayloadKind.TEXT
    assert payload_kind("image/png") is PayloadKind.BYTES and payload_kind(None) is PayloadKind.BYTES
    with pytest.raises(BadRequest):
        check_payload(PayloadKind.JSON, b"{nope")


def test_settling_a_node_gives_back_a_request_entry_and_it_holds_no_job(tmp_path: Path) -> None:
    nodes = MemoryNodes(node_ttl_s=10)
    nodes.begin_delivery(Delivery("node-a", "task-1"), request_entry("echo", "r1"))
    queues, store = MemoryJobQueues(), MemoryJobStore()
    settled = settle_deliveries("node-a", nodes, store, store, queues)
    assert settled.given_back == 1 and settled.acknowledged == []
    assert nodes.inflight("node-a") == {}
    nodes.begin_delivery(Delivery("node-a", "task-2"), request_entry("echo", "r2"))
    assert jobs_held(nodes, ["node-a"]) == {"node-a": set()}


def test_an_async_api_is_configured_as_cortex_wrote_it_and_its_handler_is_built(tmp_path: Path) -> None:
    (apis,) = parse_api_configs(
        "- name: echo\n  kind: AsyncAPI\n  handler: {path: predictor.py, config: {k: 2}}\n", source="cortex.yaml")
    (tmp_path / "predictor.py").write_text(
        "class Handler:\n    def __init__(self, config):\n        self.k = config['k']\n"
        "    def handle_async(self, request_id, payload):\n        return [request_id, payload * self.k]\n")
    predictor = AsyncPredictor.build(tmp_path, apis, model_cache_dir=tmp_path / "models")
    try:
        assert predictor.predict(21, "r1") == ["r1", 42]
    finally:
        predictor.close()
