"""AsyncAPI through the public address: a request is stored and answered with an id at once, runs on
a worker node, and its result (or failure) is recorded exactly once, even when the node running it
is killed (the session stack: two nodes, beat, the API behind the proxy, real Redis)."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from beat.steps import sweep_async_requests
from foundation import keys
from foundation.errors import StorageNotFound
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus
from jobs.asyncapi.store import RedisAsyncRequests
from sluice.client import ClientError
from testbed.waiting import wait_for

PREDICTOR = '''
import json, os, time


class PythonPredictor:
    def __init__(self, config):
        self.events = config["events"]
        self.pid = os.getpid()

    def _log(self, request_id, event):
        with open(self.events, "a") as f:
            f.write(json.dumps({"id": request_id, "pid": self.pid, "event": event}) + "\\n")

    def predict(self, payload, request_id):
        self._log(request_id, "start")
        if isinstance(payload, bytes):
            return {"type": "bytes", "size": len(payload), "head": payload[:4].hex()}
        if isinstance(payload, str):
            return {"type": "str", "text": payload}
        if isinstance(payload, dict):
            if "raise" in payload:
                raise ValueError("cannot handle " + payload["raise"])
            if "hang_once" in payload and not os.path.exists(payload["hang_once"]):
                with open(payload["hang_once"], "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(120)
            if "sleep" in payload:
                time.sleep(payload["sleep"])
            if "a_set" in payload:
                return {1, 2}
        self._log(request_id, "done")
        return {"type": type(payload).__name__, "echo": payload, "pid": self.pid}
'''

# Cortex v0.34's spelling: a Handler declaring only the payload.
HANDLER = '''
class Handler:
    def handle_async(self, payload):
        return {"doubled": payload["n"] * 2}
'''


def _deploy(client: Any, folder: Path, name: str, source: str, predictor_extra: dict[str, Any] | None = None,
            config: dict[str, Any] | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(source)
    predictor = {"type": "python", "path": "predictor.py", "config": config or {}, **(predictor_extra or {})}
    api = {"name": name, "kind": "AsyncAPI", "predictor": predictor, "compute": {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client.deploy(folder / "cortex.yaml")
    return name


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def echo_api(client, tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("async-echo")
    events = folder / "events.jsonl"
    name = _deploy(client, folder / "project", f"async-{uuid.uuid4().hex[:8]}", PREDICTOR,
                   config={"events": str(events)})
    return name, events


def test_a_request_is_answered_with_an_id_at_once_and_completes_with_its_result(client, echo_api):
    name, _ = echo_api
    request_id = client.submit_async(name, {"x": [1, 2, 3]})
    answer = client.wait_async(name, request_id, timeout=120)
    assert answer["status"] == "completed"
    assert answer["id"] == request_id
    assert answer["result"]["echo"] == {"x": [1, 2, 3]} and answer["result"]["type"] == "dict"
    assert isinstance(answer["timestamp"], float)
    assert "message" not in answer


def test_text_and_bytes_payloads_reach_predict_as_str_and_bytes(client, echo_api):
    name, _ = echo_api
    text_id = client.submit_async(name, "héllo")
    small_id = client.submit_async(name, b"\x00\x01\x02\x03rest")
    large = os.urandom(200 * 1024)  # over the inline threshold: kept in storage, not in Redis
    large_id = client.submit_async(name, large)
    assert client.wait_async(name, text_id, timeout=120)["result"] == {"type": "str", "text": "héllo"}
    assert client.wait_async(name, small_id, timeout=120)["result"] == {"type": "bytes", "size": 8, "head": "00010203"}
    assert client.wait_async(name, large_id, timeout=120)["result"] == {
        "type": "bytes", "size": len(large), "head": large[:4].hex()}


def test_the_clients_request_id_is_the_id_and_resubmitting_it_queues_nothing_again(client, echo_api):
    name, events = echo_api
    given = f"mine-{uuid.uuid4().hex}"
    assert client.submit_async(name, {"n": 1}, request_id=given) == given
    assert client.wait_async(name, given, timeout=120)["status"] == "completed"
    assert client.submit_async(name, {"n": 2}, request_id=given) == given
    assert client.get_async(name, given)["result"]["echo"] == {"n": 1}
    assert client.submit_async(name, {"n": 3}, request_id="not valid/id") != "not valid/id"
    assert [e["event"] for e in _events(events) if e["id"] == given] == ["start", "done"]


def test_a_request_whose_predict_raises_fails_with_a_one_line_message_and_is_not_retried(client, echo_api):
    name, events = echo_api
    request_id = client.submit_async(name, {"raise": "this"})
    answer = client.wait_async(name, request_id, timeout=120)
    assert answer["status"] == "failed"
    assert answer["message"] == "ValueError: cannot handle this"
    assert "result" not in answer
    assert [e["event"] for e in _events(events) if e["id"] == request_id] == ["start"]


def test_a_result_json_cannot_hold_fails_the_request_naming_its_type(client, echo_api):
    name, _ = echo_api
    answer = client.wait_async(name, client.submit_async(name, {"a_set": True}), timeout=120)
    assert answer["status"] == "failed"
    assert "predict returned a set, which is not JSON-serialisable" in answer["message"]


def test_an_unknown_id_or_an_api_of_another_kind_is_404(client, echo_api, deploy_project):
    name, _ = echo_api
    with pytest.raises(ClientError) as unknown:
        client.get_async(name, "no-such-request")
    assert unknown.value.http_status == 404 and unknown.value.kind == "request_not_found"
    batch_api = deploy_project()
    with pytest.raises(ClientError) as other:
        client.get_async(batch_api, "whatever")
    assert other.value.http_status == 404 and other.value.kind == "api_not_found"


def test_a_body_over_the_limit_is_413(client, echo_api):
    name, _ = echo_api
    with pytest.raises(ClientError) as refused:
        client.submit_async(name, b"x" * (10 * 1024 * 1024 + 1))
    assert refused.value.http_status == 413


def test_invalid_json_is_400(client, echo_api):
    name, _ = echo_api
    with pytest.raises(ClientError) as refused:
        client.submit_async(name, b"{not json", content_type="application/json")
    assert refused.value.http_status == 400


def test_a_handler_declaring_only_the_payload_is_served(client, tmp_path):
    name = _deploy(client, tmp_path / "handler", f"async-h-{uuid.uuid4().hex[:8]}", HANDLER)
    answer = client.wait_async(name, client.submit_async(name, {"n": 21}), timeout=120)
    assert answer == {"id": answer["id"], "status": "completed", "result": {"doubled": 42},
                      "timestamp": answer["timestamp"]}


def test_many_concurrent_submissions_each_complete_once_with_their_own_result(client, echo_api):
    name, events = echo_api
    payloads = [{"i": i} for i in range(200)]
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda p: client.submit_async(name, p), payloads))
    assert len(set(ids)) == len(ids)
    answers = [client.wait_async(name, request_id, timeout=300) for request_id in ids]
    assert [a["result"]["echo"] for a in answers] == payloads
    done = [e["id"] for e in _events(events) if e["event"] == "done" and e["id"] in set(ids)]
    assert sorted(done) == sorted(ids)  # each predicted to the end exactly once


def test_min_replicas_nodes_serve_an_async_api_on_its_own_queue(client, echo_api):
    """The stack has two nodes on queue cpu; the API's default `min_replicas: 1` places it on one."""
    name, _ = echo_api
    ids = [client.submit_async(name, {"n": i}) for i in range(8)]
    pids = {client.wait_async(name, request_id, timeout=120)["result"]["pid"] for request_id in ids}
    serving = client.api(name)["nodes"]
    assert len(serving) == 1 and len(pids) == 1  # every request ran in the one node placed on it


def test_a_request_past_its_request_timeout_fails_and_its_node_serves_again(client, tmp_path):
    events = tmp_path / "events.jsonl"
    name = _deploy(client, tmp_path / "slow", f"async-t-{uuid.uuid4().hex[:8]}", PREDICTOR,
                   predictor_extra={"request_timeout": 1}, config={"events": str(events)})
    slow = client.submit_async(name, {"sleep": 60})
    answer = client.wait_async(name, slow, timeout=120)
    assert answer["status"] == "failed" and answer["message"] == "timed out after 1 s"
    quick = [client.submit_async(name, {"n": i}) for i in range(4)]  # both nodes, the restarted one too
    assert all(client.wait_async(name, q, timeout=120)["status"] == "completed" for q in quick)
    assert [e["event"] for e in _events(events) if e["id"] == slow] == ["start"]  # failed, not run again


def test_a_node_killed_mid_request_gives_it_back_and_it_completes_exactly_once(client, echo_api, tmp_path):
    name, events = echo_api
    marker = tmp_path / "hanging"
    request_id = client.submit_async(name, {"hang_once": str(marker)})
    pid = int(wait_for(lambda: marker.exists() and marker.read_text(), 120, "the request to start"))
    os.kill(pid, signal.SIGKILL)
    answer = client.wait_async(name, request_id, timeout=120)
    assert answer["status"] == "completed"
    assert answer["result"]["pid"] != pid
    mine = [e for e in _events(events) if e["id"] == request_id]
    assert [e["event"] for e in mine] == ["start", "start", "done"]
    assert client.get_async(name, request_id) == answer  # recorded once: a later read is the same


def test_a_request_whose_task_message_was_lost_is_run_by_beat(stack, client, echo_api):
    # The API process stored the request and died before its task went out (or a node took the message
    # and died before taking the request): beat sends it again once it stays unstarted for its grace.
    name, events = echo_api
    store = RedisAsyncRequests(redis.Redis.from_url(stack.redis_url), retention_s=3600)
    request_id = f"lost-{uuid.uuid4().hex}"
    assert store.create(AsyncRequest(name, request_id, RequestStatus.IN_QUEUE, PayloadKind.JSON, time.time(),
                                     payload=b'{"n": 5}'), now=time.time())
    answer = client.wait_async(name, request_id, timeout=120)
    assert answer["status"] == "completed" and answer["result"]["echo"] == {"n": 5}
    assert [e["event"] for e in _events(events) if e["id"] == request_id] == ["start", "done"]
    assert store.get(name, request_id).deliveries == 1  # type: ignore[union-attr]


# -- the store and retention against real Redis and storage ---------------------------------------

@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_request_past_its_retention_is_removed_with_what_it_stored(redis_client: redis.Redis, tmp_path, s3_bucket,
                                                                    backend):
    root = str(tmp_path / "storage") if backend == "local" else f"s3://{s3_bucket}/sluice"
    store, objects = RedisAsyncRequests(redis_client, retention_s=60), RequestObjects(root)
    payload_uri = objects.put_payload("api", "r1", b"x" * 100)
    assert store.create(AsyncRequest("api", "r1", RequestStatus.IN_QUEUE, PayloadKind.BYTES, 1000.0,
                                      payload_uri=payload_uri), now=1000.0)
    assert store.begin("api", "r1", 1001.0).runs
    result_uri = objects.put_result("api", "r1", b'{"ok": true}', 1)
    assert store.finish("api", "r1", RequestStatus.COMPLETED, 1002.0, result_uri=result_uri)
    assert not store.finish("api", "r1", RequestStatus.FAILED, 1003.0, message="late")  # once only
    assert sweep_async_requests(store, objects, now=1061.0) == []  # kept 60 s after it completed
    assert sweep_async_requests(store, objects, now=1062.5) == ["api/r1"]
    assert store.get("api", "r1") is None
    for uri in (payload_uri, result_uri):
        with pytest.raises(StorageNotFound):
            objects.read(uri)
    assert store.create(AsyncRequest("api", "r2", RequestStatus.IN_QUEUE, PayloadKind.JSON, 2000.0, payload=b"1"),
                        now=2000.0)
    assert 0 < redis_client.ttl(keys.async_request("api", "r2")) <= 60  # records expire in Redis too


def test_sluice_get_lists_an_async_api_beside_the_others(stack, echo_api):
    from click.testing import CliRunner

    from sluice.cli import main

    name, _ = echo_api
    listed = CliRunner().invoke(main, ["--url", stack.url, "get"])
    assert listed.exit_code == 0, listed.output
    assert any(line.split()[:2] == [name, "AsyncAPI"] for line in listed.output.splitlines())
    one = CliRunner().invoke(main, ["--url", stack.url, "get", name])
    assert one.exit_code == 0 and f"/{name}" in one.output


# -- sharing one node with batch jobs --------------------------------------------------------------

def test_on_one_node_a_batch_job_and_async_requests_both_make_progress(one_node_stack, tmp_path):
    """Neither kind starves the other: the node takes job batches and requests in turn."""
    from tests.integration.conftest import closing_client, write_project

    client = closing_client(one_node_stack.url)
    events = tmp_path / "events.jsonl"  # both predictors write here, in the order the node ran them
    batch_api = f"share-b-{uuid.uuid4().hex[:8]}"
    client.deploy(write_project(tmp_path / "batch", batch_api, {"events": str(events), "sleep": 0.05}))
    async_api = _deploy(client, tmp_path / "async", f"share-a-{uuid.uuid4().hex[:8]}", PREDICTOR,
                        config={"events": str(events)})
    client.wait_async(async_api, client.submit_async(async_api, {"warm": True}), timeout=120)  # built

    total = 60
    job_id = client.submit(batch_api, list(range(total)), batch_size=1)["job_id"]
    wait_for(lambda: any(e.get("event") == "predict" for e in _events(events)), 120, "the job to start")
    request_ids = [client.submit_async(async_api, {"n": i}) for i in range(10)]
    answers = [client.wait_async(async_api, r, timeout=120) for r in request_ids]
    assert all(a["status"] == "completed" for a in answers)
    # Every request completed while the job still had batches to run: requests are not starved by it.
    job = client.job(batch_api, job_id)
    assert job["status"] == "status_running", job

    ran = _events(events)
    async_done = [i for i, e in enumerate(ran) if e.get("event") == "done" and e.get("id") in set(request_ids)]
    batches = [i for i, e in enumerate(ran) if e.get("event") == "predict" and e.get("job_id") == job_id]
    # ... and the job progressed while the requests were queued: batches ran between them.
    assert any(async_done[0] < b < async_done[-1] for b in batches), ran
    assert client.wait(batch_api, job_id, timeout=120)["status"] == "status_succeeded"


# -- server_side_batching ----------------------------------------------------------------------------

BATCHING_PREDICTOR = '''
import json, logging, os, time


class PythonPredictor:
    def __init__(self, config):
        self.events = config["events"]

    def _log(self, ids, event):
        with open(self.events, "a") as f:
            f.write(json.dumps({"ids": ids, "pid": os.getpid(), "event": event}) + "\\n")

    def predict(self, payload, request_id):
        self._log(request_id, "start")
        logging.getLogger("batching-predictor").warning("batch of %d: %s", len(payload), ",".join(request_id))
        for item in payload:
            if "hang_once" in item and not os.path.exists(item["hang_once"]):
                with open(item["hang_once"], "w") as f:
                    f.write(str(os.getpid()))
                time.sleep(120)
        if any("short" in item for item in payload):
            return payload[:-1]
        self._log(request_id, "done")
        return [{"echo": item, "id": one, "batch": len(payload)} for item, one in zip(payload, request_id)]
'''


@pytest.fixture(scope="module")
def batching_api(client, tmp_path_factory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("async-batching")
    events = folder / "events.jsonl"
    name = _deploy(client, folder / "project", f"async-sb-{uuid.uuid4().hex[:8]}", BATCHING_PREDICTOR,
                   predictor_extra={"server_side_batching": {"max_batch_size": 8, "batch_interval": "200ms"}},
                   config={"events": str(events)})
    return name, events


def test_batched_requests_share_predict_calls_and_each_gets_its_own_result_once(client, batching_api):
    name, events = batching_api
    payloads = [{"i": i} for i in range(60)]
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda p: client.submit_async(name, p), payloads))
    answers = [client.wait_async(name, request_id, timeout=300) for request_id in ids]
    assert [a["status"] for a in answers] == ["completed"] * len(ids)
    assert [(a["result"]["echo"], a["result"]["id"]) for a in answers] == list(zip(payloads, ids, strict=True))
    sizes = [a["result"]["batch"] for a in answers]
    assert max(sizes) > 1 and max(sizes) <= 8  # gathered, never past max_batch_size
    done = [one for e in _events(events) if e["event"] == "done" for one in e["ids"] if one in set(ids)]
    assert sorted(done) == sorted(ids)  # each predicted in exactly one call

    # The batch's predict logged once; its line is in the log of each request of the batch.
    batched = next(a for a in answers if a["result"]["batch"] > 1)
    batch = next(e["ids"] for e in _events(events) if e["event"] == "done" and batched["id"] in e["ids"])
    line = f"batch of {len(batch)}: {','.join(batch)}"
    for request_id in batch:
        wait_for(lambda r=request_id: line in [x["message"] for x in client.get_async_logs(name, r)["lines"]],
                 30, f"the batch's line in request {request_id}'s log")


def test_a_batch_answered_with_the_wrong_length_fails_each_of_its_requests(client, batching_api):
    name, _ = batching_api
    answer = client.wait_async(name, client.submit_async(name, {"short": True}), timeout=120)
    assert answer["status"] == "failed"
    assert "predict must return a list of one result per request; it returned a list of 0" in answer["message"]


def test_a_node_killed_mid_batch_gives_its_requests_back_and_each_completes_once(client, batching_api, tmp_path):
    name, events = batching_api
    marker = tmp_path / "hanging"
    ids = [client.submit_async(name, {"hang_once": str(marker)})]
    ids += [client.submit_async(name, {"n": i}) for i in range(5)]
    pid = int(wait_for(lambda: marker.exists() and marker.read_text(), 120, "the batch to start"))
    os.kill(pid, signal.SIGKILL)
    answers = [client.wait_async(name, request_id, timeout=120) for request_id in ids]
    assert [a["status"] for a in answers] == ["completed"] * len(ids)
    ran = _events(events)
    killed = next(e["ids"] for e in ran if e["event"] == "start" and e["pid"] == pid and ids[0] in e["ids"])
    done = [one for e in ran if e["event"] == "done" for one in e["ids"] if one in set(ids)]
    assert sorted(done) == sorted(ids)  # the killed batch's requests too, each once
    assert all(answers[ids.index(one)]["result"]["id"] == one for one in killed)
    assert client.get_async(name, ids[0]) == answers[0]


# -- the kernel's hard stop ------------------------------------------------------------------------

GIL_PREDICTOR = '''
import ctypes, json, os


class PythonPredictor:
    def __init__(self, config):
        self.events = config["events"]

    def predict(self, payload, request_id):
        with open(self.events, "a") as f:
            f.write(json.dumps({"id": request_id, "pid": os.getpid(), "event": "start"}) + "\\n")
        if payload.get("gil"):
            ctypes.PyDLL(None).sleep(3600)  # a C call that keeps the GIL: the watchdog thread never runs
        return {"ok": True}
'''


def test_a_request_holding_the_gil_past_its_timeout_is_ended_by_the_kernel_and_fails(one_node_stack, tmp_path):
    """The watchdog thread cannot run: SIGALRM ends the node HARD_STOP_GRACE_S past the limit, the
    request's next delivery runs it once more, and the one after fails it instead of looping."""
    from tests.integration.conftest import closing_client

    client = closing_client(one_node_stack.url)
    events = tmp_path / "events.jsonl"
    name = _deploy(client, tmp_path / "gil", f"async-gil-{uuid.uuid4().hex[:8]}", GIL_PREDICTOR,
                   predictor_extra={"request_timeout": 1}, config={"events": str(events)})
    request_id = client.submit_async(name, {"gil": True})
    answer = client.wait_async(name, request_id, timeout=120)
    assert answer["status"] == "failed"
    assert answer["message"].startswith("the process running it ended 2 times: it ran past its request_timeout (1 s)")
    starts = [e for e in _events(events) if e["id"] == request_id]
    assert len(starts) == 2 and starts[0]["pid"] != starts[1]["pid"]  # each try's process ended by the kernel
    quick = client.submit_async(name, {"gil": False})
    assert client.wait_async(name, quick, timeout=120)["status"] == "completed"  # the node serves again

