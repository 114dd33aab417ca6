"""An AsyncAPI request on a worker node, with the in-memory request store, nodes and registry."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from foundation.api_registry import DeployedApi
from foundation.errors import BadRequest, PredictorError
from foundation.limits import ASYNC_INLINE_RESULT_BYTES
from foundation.log_streams import StreamLogHandler, api_stream, request_stream
from foundation.memory import MemoryApiRegistry, MemoryLogStreams
from jobs.asyncapi.memory import MemoryAsyncRequests
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus, check_payload, payload_kind
from jobs.asyncapi.runner import AsyncPredictors, AsyncRuntime
from jobs.batch.time_limit import EXIT_STOPPED_BATCH
from jobs.nodes.memory import MemoryNodes
from jobs.nodes.registry import jobs_held
from jobs.store.memory import MemoryJobStore
from jobs.transport.delivery import Delivery, request_entry
from jobs.transport.memory import MemoryJobQueues
from jobs.transport.settle import settle_deliveries
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
        self.nodes = MemoryNodes(node_ttl_s=10, inflight=self.requests.inflight)
        self.builder = Builder(predict)
        self.ending = Ending()
        self.runtime = AsyncRuntime(self.requests, self.objects, self.registry, self.nodes,
                                    AsyncPredictors(self.builder), end_process=self.ending, clock=lambda: 50.0,
                                    deployment_ttl_s=0)

    def submit(self, request_id: str, body: bytes, kind: PayloadKind = PayloadKind.JSON) -> None:
        self.requests.create(AsyncRequest("echo", request_id, RequestStatus.IN_QUEUE, kind, 10.0, payload=body), 10.0)

    def record(self, request_id: str) -> AsyncRequest:
        record = self.requests.get("echo", request_id)
        assert record is not None
        return record


def test_a_request_runs_once_per_delivery_and_its_small_result_is_kept_in_its_record(tmp_path: Path) -> None:
    seen: list[tuple[Any, str]] = []
    h = Harness(tmp_path, lambda payload, request_id: seen.append((payload, request_id)) or {"ok": payload})
    h.submit("r1", b'{"a": 1}')
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    record = h.record("r1")
    assert record.status is RequestStatus.COMPLETED and record.timestamp == 50.0
    assert (record.result, record.result_uri) == (b'{"ok": {"a": 1}}', "")  # no object written for it
    assert seen == [({"a": 1}, "r1")]
    assert h.nodes.inflight("node-a") == {}  # the delivery left the node's in-flight hash


def test_a_delivery_is_in_its_nodes_in_flight_hash_while_its_request_runs(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []
    h = Harness(tmp_path, lambda payload, request_id: seen.append(h.nodes.inflight("node-a")) or payload)
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert seen == [{"task-1": request_entry("echo", "r1")}]  # a node dying now has it given back
    assert h.record("r1").status is RequestStatus.COMPLETED and h.nodes.inflight("node-a") == {}


def _raises(payload: Any, request_id: str) -> Any:
    raise ValueError("bad input")


@pytest.mark.parametrize("case", ["completed", "raises", "not json", "cannot build", "ended already", "unknown",
                                  "held by a batch", "api deleted", "large result"])
def test_a_delivery_leaves_its_nodes_in_flight_hash_whatever_becomes_of_its_request(tmp_path: Path, case: str) -> None:
    predict = {"raises": _raises, "not json": lambda payload, request_id: object(), "cannot build": None,
               "large result": lambda payload, request_id: "x" * ASYNC_INLINE_RESULT_BYTES}.get(
        case, lambda payload, request_id: payload)
    h = Harness(tmp_path, predict)
    h.submit("r1", b"1")
    if case == "ended already":
        h.runtime.run_request("echo", "r1", Delivery("node-b", "task-0"))
    elif case == "held by a batch":
        h.requests.begin("echo", "r1", 40.0, owner="task-0")
    elif case == "api deleted":
        h.registry.delete("echo")
    h.runtime.run_request("echo", "r1" if case != "unknown" else "nope", Delivery("node-a", "task-1"))
    assert h.nodes.inflight("node-a") == {} and h.nodes.inflight("node-b") == {}


def test_a_result_over_the_inline_limit_goes_to_storage_not_to_the_record(tmp_path: Path) -> None:
    big = "x" * ASYNC_INLINE_RESULT_BYTES
    h = Harness(tmp_path, lambda payload, request_id: {"text": big})
    h.submit("r1", b'{"a": 1}')
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    record = h.record("r1")
    assert record.status is RequestStatus.COMPLETED and record.result is None
    assert json.loads(h.objects.read(record.result_uri)) == {"text": big}


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


def test_a_node_reads_an_apis_deployment_once_a_second_and_sees_a_redeploy_after_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, lambda payload, request_id: payload)
    now = [50.0]
    h.runtime._clock, h.runtime._deployment_ttl_s = (lambda: now[0]), 1.0
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1")
    h.registry.put(api_config(), "bundle-2", now=2.0)
    now[0] += 0.5
    h.submit("r2", b"1")
    h.runtime.run_request("echo", "r2")
    assert len(h.builder.built) == 1  # within the second: the version it read
    now[0] += 0.6
    h.submit("r3", b"1")
    h.runtime.run_request("echo", "r3")
    assert len(h.builder.built) == 2 and h.builder.built[0].closed  # read again: the new version


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
    in_flight_at_the_end: list[dict[str, str]] = []
    h.runtime._end_process = lambda status: (
        ending_stub(status), in_flight_at_the_end.append(h.nodes.inflight("node-a")), ending.set())
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert ending_stub.statuses == [EXIT_STOPPED_BATCH]
    # The process ends holding the delivery, so that settling gives its message back (to be acknowledged).
    assert in_flight_at_the_end == [{"task-1": request_entry("echo", "r1")}]
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


# -- server_side_batching -------------------------------------------------------------------------

BATCHING = {"server_side_batching": {"max_batch_size": 3, "batch_interval": 0.1}}


class FakeTime:
    """The runner's clock and sleep: sleeping advances the clock (and may run a callback)."""

    def __init__(self) -> None:
        self.now = 50.0
        self.on_sleep: Any = None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


def batching_harness(tmp_path: Path, predict: Any, **predictor: Any) -> tuple[Harness, FakeTime]:
    h = Harness(tmp_path, predict, **{**BATCHING, **predictor})
    fake = FakeTime()
    h.runtime._clock, h.runtime._sleep = fake.clock, fake.sleep
    return h, fake


def queue(h: Harness, *request_ids: str) -> None:
    for request_id in request_ids:
        h.submit(request_id, f'{{"n": "{request_id}"}}'.encode())
        h.requests.queue("echo", request_id)


def test_a_batching_delivery_takes_up_to_max_batch_size_queued_requests_into_one_predict(tmp_path: Path) -> None:
    calls: list[tuple[Any, Any]] = []
    h, _ = batching_harness(tmp_path, lambda payload, request_id: calls.append((payload, request_id)) or
                            [{"got": p["n"], "id": i} for p, i in zip(payload, request_id, strict=True)])
    queue(h, "r1", "r2", "r3", "r4", "r5")
    h.runtime.run_request("echo", "r2", Delivery("node-a", "task-2"))  # its own delivery leads the batch
    assert calls == [([{"n": "r2"}, {"n": "r1"}, {"n": "r3"}], ["r2", "r1", "r3"])]
    for request_id in ("r1", "r2", "r3"):  # each request its own element
        record = h.record(request_id)
        assert record.status is RequestStatus.COMPLETED
        assert record.result == f'{{"got": "{request_id}", "id": "{request_id}"}}'.encode()
    assert h.record("r4").status is RequestStatus.IN_QUEUE and h.record("r5").status is RequestStatus.IN_QUEUE
    h.runtime.run_request("echo", "r3", Delivery("node-b", "task-3"))  # ended in r2's batch: nothing runs
    assert len(calls) == 1


def test_a_delivery_finding_its_request_in_another_batch_leaves_it_to_that_batch(tmp_path: Path) -> None:
    calls: list[Any] = []
    h, _ = batching_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or list(payload))
    queue(h, "r1", "r2")
    assert h.requests.begin("echo", "r1", 1.0, owner="task-1").runs  # a batch elsewhere holds r1 and r2
    assert [r for r, _ in h.requests.claim("echo", "task-1", 2, 1.0)] == ["r2"]
    h.runtime.run_request("echo", "r2", Delivery("node-b", "task-2"))
    assert calls == [] and h.record("r2").status is RequestStatus.IN_PROGRESS


def test_the_batch_of_a_node_that_died_is_taken_again_by_its_message_and_recorded_once(tmp_path: Path) -> None:
    calls: list[Any] = []
    h, _ = batching_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or list(payload))
    queue(h, "r1", "r2", "r3")
    h.requests.begin("echo", "r1", 1.0, owner="task-1")  # task-1's node took r1, claimed r2 and r3, then died
    h.requests.claim("echo", "task-1", 2, 1.0)
    h.runtime.run_request("echo", "r1", Delivery("node-b", "task-1"))  # its message, given back
    assert calls == [["r1", "r2", "r3"]]
    assert all(h.record(r).status is RequestStatus.COMPLETED and h.record(r).deliveries == 2
               for r in ("r1", "r2", "r3"))
    h.runtime.run_request("echo", "r1", Delivery("node-b", "task-1"))  # once more: all ended, nothing runs
    assert len(calls) == 1


def test_a_batch_waits_at_most_batch_interval_for_more_requests(tmp_path: Path) -> None:
    calls: list[Any] = []
    h, fake = batching_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or list(payload))
    queue(h, "r1")
    fake.on_sleep = lambda: (queue(h, "r2"), setattr(fake, "on_sleep", None))  # arrives during the window
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert calls == [["r1", "r2"]]
    assert fake.now <= 50.0 + 0.1 + 1e-9  # the window closed, nothing more came: it ran without a third


@pytest.mark.parametrize(("predict", "message"), [
    (lambda payload, request_id: payload[:1], "it returned a list of 1 for 2 request(s)"),
    (lambda payload, request_id: {"not": "a list"}, "it returned a dict for 2 request(s)"),
    (lambda payload, request_id: 1 / 0, "ZeroDivisionError: division by zero"),
])
def test_a_batch_whose_predict_raises_or_answers_the_wrong_shape_fails_each_request(
        tmp_path: Path, predict: Any, message: str) -> None:
    h, _ = batching_harness(tmp_path, predict, server_side_batching={"max_batch_size": 2, "batch_interval": 0.1})
    queue(h, "r1", "r2")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    for request_id in ("r1", "r2"):
        assert h.record(request_id).status is RequestStatus.FAILED
        assert message in h.record(request_id).message


def test_an_element_json_cannot_hold_fails_only_its_request(tmp_path: Path) -> None:
    h, _ = batching_harness(tmp_path, lambda payload, request_id: [{"ok": 1}, {1, 2}])
    queue(h, "r1", "r2")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert h.record("r1").status is RequestStatus.COMPLETED
    assert h.record("r2").status is RequestStatus.FAILED and "predict returned a set" in h.record("r2").message


def test_a_batch_past_its_timeout_fails_every_request_then_ends_the_process(tmp_path: Path) -> None:
    ending = threading.Event()

    def predict(payload: Any, request_id: Any) -> Any:
        ending.wait(30)
        return list(payload)

    h, _ = batching_harness(tmp_path, predict, request_timeout=0.05)
    h.runtime._end_process = lambda status: ending.set()
    queue(h, "r1", "r2")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert [h.record(r).message for r in ("r1", "r2")] == ["timed out after 0.05 s"] * 2


# -- a request whose nodes keep dying (a predictor holding the GIL past its limit) -----------------

def test_a_request_whose_node_died_once_runs_again_and_one_dying_every_time_is_failed(tmp_path: Path) -> None:
    calls: list[str] = []
    h = Harness(tmp_path, lambda payload, request_id: calls.append(request_id) or "ok", request_timeout=1)
    h.submit("r1", b"1")
    h.requests.begin("echo", "r1", 1.0, owner="task-1")  # its node was ended (the kernel's hard stop, say)
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))  # the next delivery runs it
    assert calls == ["r1"] and h.record("r1").status is RequestStatus.COMPLETED
    h.submit("r2", b"1")
    for _ in range(2):  # ended twice
        h.requests.begin("echo", "r2", 1.0, owner="task-2")
    h.runtime.run_request("echo", "r2", Delivery("node-a", "task-2"))
    assert calls == ["r1"]
    record = h.record("r2")
    assert record.status is RequestStatus.FAILED
    assert record.message == ("the process running it ended 2 times: it ran past its request_timeout (1 s) "
                              "holding the GIL, or its node died each time")


def test_a_request_arms_the_kernels_hard_stop_for_its_time_limit(tmp_path: Path, monkeypatch) -> None:
    import signal

    alarms: list[int] = []
    monkeypatch.setattr(signal, "alarm", lambda seconds: alarms.append(seconds) or 0)
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_DFL)  # as in a node (not pytest-timeout)
    h = Harness(tmp_path, lambda payload, request_id: "ok", request_timeout=2.5)
    h.runtime._hard_stop_grace_s = 2.0
    h.submit("r1", b"1")
    h.runtime.run_request("echo", "r1", Delivery("node-a", "task-1"))
    assert alarms == [5, 0]  # armed for ceil(2.5 + 2) s around predict, then disarmed
    assert h.record("r1").status is RequestStatus.COMPLETED


def test_an_async_apis_batching_is_checked_at_deploy_and_not_bound_by_threads() -> None:
    from foundation.errors import ConfigError

    text = ("- name: echo\n  kind: {kind}\n  predictor: {{path: p.py, type: {type}, {models}"
            "server_side_batching: {{max_batch_size: 32, batch_interval: 50ms}}}}\n")
    (api,) = parse_api_configs(text.format(kind="AsyncAPI", type="python", models=""), source="cortex.yaml")
    assert api.predictor.server_side_batching is not None
    assert (api.predictor.server_side_batching.max_batch_size, api.predictor.server_side_batching.batch_interval) \
        == (32, 0.05)  # one node takes the batch: no thread per request, unlike a realtime replica
    with pytest.raises(ConfigError, match=r"predictor.server_side_batching.max_batch_size: must be <= threads"):
        parse_api_configs(text.format(kind="RealtimeAPI", type="python", models=""), source="cortex.yaml")
    with pytest.raises(ConfigError, match=r"predictor.server_side_batching: an AsyncAPI batches only predictors of "
                                          r"type python or onnx \(type is tensorflow\)"):
        parse_api_configs(text.format(kind="AsyncAPI", type="tensorflow", models="models: {path: s3://b/m}, "),
                          source="cortex.yaml")


def test_a_batch_claimed_before_a_redeploy_without_batching_is_run_one_request_at_a_time(tmp_path: Path) -> None:
    calls: list[Any] = []
    h, _ = batching_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or payload)
    queue(h, "r1", "r2")
    h.requests.begin("echo", "r1", 1.0, owner="task-1")  # claimed together, then the node died
    h.requests.claim("echo", "task-1", 1, 1.0)
    h.registry.put(api_config(), "bundle-1", now=2.0)  # redeployed without server_side_batching
    h.runtime.run_request("echo", "r1", Delivery("node-b", "task-1"))
    assert calls == ["r1", "r2"]
    assert [h.record(r).status for r in ("r1", "r2")] == [RequestStatus.COMPLETED] * 2


# -- a task per batch of queued requests (server_side_batching) --------------------------------------
def queued_harness(tmp_path: Path, predict: Any) -> tuple[Harness, list[str]]:
    """A batching harness whose runtime records the tasks it sends for the API's queued requests."""
    h, _ = batching_harness(tmp_path, predict)
    woken: list[str] = []
    h.runtime._wake = woken.append
    return h, woken


def test_a_burst_sends_one_task_and_each_task_runs_a_batch_then_sends_the_next_while_some_are_queued(
        tmp_path: Path) -> None:
    calls: list[Any] = []
    h, woken = queued_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or list(payload))
    sends = []
    for request_id in ("r1", "r2", "r3", "r4", "r5"):
        h.submit(request_id, f'{{"n": "{request_id}"}}'.encode())
        sends.append(h.requests.queue("echo", request_id))
    assert sends == [True, False, False, False, False]  # one task on its way for the whole burst
    h.runtime.run_queued("echo", Delivery("node-a", "task-1"))
    assert calls == [["r1", "r2", "r3"]]  # oldest first, max_batch_size of them
    assert woken == ["echo"]  # two still queued: the next task is sent
    assert h.nodes.inflight("node-a") == {}
    h.runtime.run_queued("echo", Delivery("node-a", "task-2"))
    assert calls == [["r1", "r2", "r3"], ["r4", "r5"]] and woken == ["echo"]  # none left: no more tasks
    assert all(h.record(r).status is RequestStatus.COMPLETED for r in ("r1", "r2", "r3", "r4", "r5"))
    h.submit("r6", b'{"n": "r6"}')
    assert h.requests.queue("echo", "r6")  # the next burst sends a task again


def test_a_request_queued_while_a_task_gathers_sends_another_task(tmp_path: Path) -> None:
    h, _ = queued_harness(tmp_path, lambda payload, request_id: list(payload))
    queue(h, "r1")
    sent: list[bool] = []
    fake_sleep = h.runtime._sleep

    def sleep(seconds: float) -> None:  # while the task waits for more: a request comes in
        if not sent:
            h.submit("r9", b'{"n": "r9"}')
            sent.append(h.requests.queue("echo", "r9"))
        fake_sleep(seconds)

    h.runtime._sleep = sleep
    h.runtime.run_queued("echo", Delivery("node-a", "task-1"))
    assert sent == [True]  # the running task had started: the request sent a task of its own


def test_the_queued_task_of_a_node_that_died_takes_its_batch_again_and_records_it_once(tmp_path: Path) -> None:
    calls: list[Any] = []
    h, woken = queued_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or list(payload))
    queue(h, "r1", "r2", "r3", "r4")
    assert [r for r, _ in h.requests.claim("echo", "task-1", 3, 1.0)] == ["r1", "r2", "r3"]  # then its node died
    h.runtime.run_queued("echo", Delivery("node-b", "task-1"))  # its message, given back
    assert calls == [["r1", "r2", "r3"]]
    assert all(h.record(r).deliveries == 2 and h.record(r).status is RequestStatus.COMPLETED
               for r in ("r1", "r2", "r3"))
    assert h.record("r4").status is RequestStatus.IN_QUEUE and woken == ["echo"]


def test_queued_requests_of_an_api_deleted_since_are_failed_saying_so(tmp_path: Path) -> None:
    h, woken = queued_harness(tmp_path, lambda payload, request_id: list(payload))
    queue(h, "r1", "r2")
    h.registry.delete("echo")
    h.runtime.run_queued("echo", Delivery("node-a", "task-1"))
    for request_id in ("r1", "r2"):
        record = h.record(request_id)
        assert (record.status, record.message) == (RequestStatus.FAILED, "api echo is not deployed any more")
    assert woken == []


def test_queued_requests_of_an_api_redeployed_without_batching_run_one_at_a_time(tmp_path: Path) -> None:
    calls: list[Any] = []
    h, _ = queued_harness(tmp_path, lambda payload, request_id: calls.append(request_id) or {"one": payload})
    queue(h, "r1", "r2")
    h.registry.put(api_config(), "bundle-1", now=2.0)  # no server_side_batching any more
    h.runtime.run_queued("echo", Delivery("node-a", "task-1"))
    assert calls == ["r1", "r2"]
    assert h.record("r2").result == b'{"one": {"n": "r2"}}'


# -- log lines: a batch's predict is every one of its requests' ---------------------------------------
def test_each_line_of_a_batched_predict_is_in_every_requests_log_and_a_failure_only_in_its_own(
        tmp_path: Path) -> None:
    user = logging.getLogger("test.async_runner.user_predictor")

    def predict(payload: Any, request_id: Any) -> Any:
        user.warning("predicting a batch of %d", len(payload))
        return [{"ok": 1}, {1, 2}, {"ok": 3}]  # the second request's element is not JSON

    h, _ = queued_harness(tmp_path, predict)
    streams = MemoryLogStreams(max_lines=1000, retention_s=3600)
    handler = StreamLogHandler(streams, flush_interval_s=3600)
    runner_log = logging.getLogger("jobs.asyncapi.runner")
    for logger in (user, runner_log):
        logger.addHandler(handler)
    h.runtime._capture = handler.capturing_requests
    queue(h, "r1", "r2", "r3")
    try:
        with handler.capturing_requests("echo", []):  # as the worker wraps a task for queued requests
            h.runtime.run_queued("echo", Delivery("node-a", "task-1"))
        handler.flush()
    finally:
        for logger in (user, runner_log):
            logger.removeHandler(handler)

    def messages(stream: str) -> list[str]:
        return [line["message"] for line in streams.read(stream).lines]

    failure = "async request r2 of api echo failed: predict returned a set, which is not JSON-serialisable"
    for request_id in ("r1", "r2", "r3"):
        assert "predicting a batch of 3" in messages(request_stream("echo", request_id))
    assert any(m.startswith(failure) for m in messages(request_stream("echo", "r2")))
    others = messages(request_stream("echo", "r1")) + messages(request_stream("echo", "r3"))
    assert not any("failed" in m for m in others)
    whole = messages(api_stream("echo"))
    assert whole.count("predicting a batch of 3") == 1 and any(m.startswith(failure) for m in whole)
