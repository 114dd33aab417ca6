"""A hung predictor never holds a node for good: batches have a time limit, and a job that times out
or is stopped ends its in-flight batches; beat, in its own process, keeps timing jobs out meanwhile.

Each test runs on a real stack (redis-server, worker nodes, beat and the API): the session's
one-node stack or its two-node one, or, for the visibility timeout, a stack of this module; the
predictor below hangs forever on the item "hang", as a predictor stuck in a C call or a dead socket.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from jobs.store import JobStore
from sluice.client import Client
from sluice.embedded import Stack, free_port
from testbed.waiting import wait_for as _wait_for

from .conftest import FAST_LOOPS, ROOM, closing_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HANGING_PREDICTOR = '''
import ctypes, json, os, time


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.events = config["events"]
        self.job_id = job_spec["job_id"]
        self.hang_on_complete = config.get("hang_on_complete", False)

    def _log(self, event, **fields):
        record = {"event": event, "pid": os.getpid(), "job_id": self.job_id, "t": time.time(), **fields}
        with open(self.events, "a") as f:
            f.write(json.dumps(record) + "\\n")

    def predict(self, payload, batch_id):
        self._log("predict", items=payload)
        if "hang" in payload:
            while True:  # never returns, never raises
                time.sleep(3600)
        for item in payload:
            if isinstance(item, str) and item.startswith("gate:"):  # runs until the test opens the gate
                give_up = time.monotonic() + 120
                while not os.path.exists(item.split(":", 1)[1]) and time.monotonic() < give_up:
                    time.sleep(0.05)
        if "gil" in payload:
            ctypes.PyDLL(None).sleep(3600)  # a C call that keeps the GIL: no other thread of the process runs

    def on_job_complete(self):
        self._log("complete")
        if self.hang_on_complete:
            while True:
                time.sleep(3600)
'''


@pytest.fixture(scope="module")
def one_node(one_node_stack: Stack) -> Stack:
    """The session's one-node stack, its hard stop's grace short (conftest.py's HARD_STOP_GRACE_S)."""
    return one_node_stack


@pytest.fixture(scope="module")
def two_nodes(stack: Stack) -> Stack:
    """The session's stack (two nodes): no test on it sets a batch time limit, so its grace does not count."""
    return stack


@pytest.fixture(scope="module")
def two_nodes_short_visibility(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of this module alone: the visibility timeout is a setting of the broker connection,
    one for every process of a stack, and a short one here is what the test is about."""
    data_dir = tmp_path_factory.mktemp("stack-short-visibility")
    with Stack(port=free_port(), offers=ROOM, workers=2, data_dir=data_dir,
               env={**FAST_LOOPS, "SLUICE_VISIBILITY_TIMEOUT": str(SHORT_VISIBILITY_S)}) as running:
        yield running
        print(running.logs())


SHORT_VISIBILITY_S = 2


def _deploy(stack: Stack, folder: Path) -> tuple[Client, str]:
    api_name = f"hang-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(HANGING_PREDICTOR)
    api = {"name": api_name, "kind": "BatchAPI", "predictor": {"type": "python", "path": "predictor.py"}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    client = closing_client(stack.url)
    client.deploy(folder / "cortex.yaml")
    return client, api_name


def _submit(client: Client, api: str, events: Path, items: list[Any], **fields: Any) -> str:
    body = {"workers": 1, "item_list": {"items": items, "batch_size": 1}, "config": {"events": str(events)}, **fields}
    return client.submit_raw(api, body)["job_id"]


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]



def _hung(events: Path, job_id: str, count: int = 1) -> list[dict[str, Any]]:
    """The first `count` tries of the hanging batch, once that many have started."""
    hangs = [e for e in _events(events) if e["job_id"] == job_id and e["event"] == "predict" and "hang" in e["items"]]
    return hangs if len(hangs) >= count else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _nodes_of(stack: Stack, job_id: str) -> list[str]:
    return JobStore(redis.Redis.from_url(stack.redis_url or "")).state(job_id).nodes


def _worker_names(stack: Stack) -> set[str]:
    return {c.name for c in stack.children if c.is_worker}


def test_a_hung_batch_is_stopped_at_its_time_limit_retried_then_failed_and_the_job_completes(
    one_node: Stack, tmp_path: Path
) -> None:
    client, api = _deploy(one_node, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    job_id = _submit(client, api, events, [0, 1, "hang", 3], batch_timeout=2,
                     sqs_dead_letter_queue={"arn": "", "max_receive_count": 2})

    final = client.wait(api, job_id, timeout=120)

    assert final["status"] == "status_completed_with_failures", final
    assert final["batch_metrics"]["succeeded"] == 3 and final["batch_metrics"]["failed"] == 1
    assert final["batch_timeout"] == 2
    [failed] = client.failed_batches(api, job_id)
    assert (failed["index"], failed["tries"], failed["error"], failed["payload"]) == (
        2, 2, "timed out after 2 s", ["hang"])
    seen = _events(events)
    tries = [e for e in seen if e["event"] == "predict" and e["items"] == ["hang"]]
    assert len(tries) == 2 and tries[0]["pid"] != tries[1]["pid"]  # each try ended its node's process
    ran = sorted(str(i) for e in seen if e["event"] == "predict" for i in e["items"])
    assert ran == ["0", "1", "3", "hang", "hang"]
    assert [e["event"] for e in seen].count("complete") == 1
    after_first_limit = min(e["t"] for e in seen if e["t"] > tries[0]["t"] + 2 and e["event"] == "predict")
    print(f"\nFIGURE batch time limit 2 s: the node ran its next batch {after_first_limit - tries[0]['t'] - 2:.1f} s "
          "after the limit expired")

    # The node came back and serves the next job.
    next_job = _submit(client, api, events, [10, 11])
    assert client.wait(api, next_job, timeout=60)["status"] == "status_succeeded"
    assert not any(_alive(e["pid"]) for e in tries)


def test_a_hung_on_job_complete_is_stopped_at_the_batch_time_limit_and_the_job_completes_with_the_reason(
    one_node: Stack, tmp_path: Path
) -> None:
    client, api = _deploy(one_node, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    body = {"workers": 1, "item_list": {"items": [0, 1], "batch_size": 1}, "batch_timeout": 2,
            "config": {"events": str(events), "hang_on_complete": True}}
    job_id = client.submit_raw(api, body)["job_id"]

    final = client.wait(api, job_id, timeout=60)

    assert final["status"] == "status_completed_with_failures", final
    assert final["batch_metrics"]["succeeded"] == 2
    assert "on_job_complete timed out after 2 s" in final.get("message", ""), final
    [complete] = [e for e in _events(events) if e["event"] == "complete"]  # run once, never again
    _wait_for(lambda: not _alive(complete["pid"]), 30, "the hung node process to end")
    # The node came back and serves the next job.
    next_job = _submit(client, api, events, [10, 11])
    assert client.wait(api, next_job, timeout=60)["status"] == "status_succeeded"
    assert len([e for e in _events(events) if e["event"] == "complete"]) == 2


def test_a_job_timeout_ends_its_hung_batch_and_frees_the_only_node_for_the_next_job(
    one_node: Stack, tmp_path: Path
) -> None:
    client, api = _deploy(one_node, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    hung_job = _submit(client, api, events, ["hang", 1, 2], timeout=3)
    [hang] = _wait_for(lambda: _hung(events, hung_job), 60, "the hanging batch")
    waiting_job = _submit(client, api, events, [10, 11])  # queued behind the hung batch, on the same node

    hung = client.wait(api, hung_job, timeout=60)  # beat times it out, though its only node is hung

    assert hung["status"] == "status_timed_out"
    assert client.wait(api, waiting_job, timeout=60)["status"] == "status_succeeded"
    assert not _alive(hang["pid"])
    served = min(e["t"] for e in _events(events) if e["job_id"] == waiting_job and e["event"] == "predict")
    after_timeout = served - _epoch(hung["start_time"]) - 3
    print(f"\nFIGURE job timeout with a hung predictor: the node served the next job {after_timeout:.1f} s "
          "after the job's timeout")


def test_stopping_a_job_ends_its_in_flight_batch(one_node: Stack, tmp_path: Path) -> None:
    client, api = _deploy(one_node, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    job_id = _submit(client, api, events, ["hang", 1, 2])
    [hang] = _wait_for(lambda: _hung(events, job_id), 60, "the hanging batch")

    client.stop(api, job_id)

    _wait_for(lambda: not _alive(hang["pid"]), 30, "the hung batch's process to end")
    next_job = _submit(client, api, events, [10])
    assert client.wait(api, next_job, timeout=60)["status"] == "status_succeeded"
    assert [e["items"] for e in _events(events) if e["job_id"] == job_id] == [["hang"]]


def test_with_two_nodes_the_next_job_goes_to_the_node_not_hung_on_a_timed_out_job(
    two_nodes: Stack, tmp_path: Path
) -> None:
    client, api = _deploy(two_nodes, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    hung_job = _submit(client, api, events, ["hang"], timeout=2)
    [hang] = _wait_for(lambda: _hung(events, hung_job), 60, "the hanging batch")
    [hung_node] = _nodes_of(two_nodes, hung_job)
    assert client.wait(api, hung_job, timeout=60)["status"] == "status_timed_out"

    next_job = _submit(client, api, events, [10, 11, 12])

    [chosen] = _nodes_of(two_nodes, next_job)
    assert chosen != hung_node
    assert client.wait(api, next_job, timeout=60)["status"] == "status_succeeded"
    assert {e["pid"] for e in _events(events) if e["job_id"] == next_job} != {hang["pid"]}


def test_a_predictor_holding_the_gil_past_its_time_limit_is_ended_by_the_kernel(
    one_node: Stack, tmp_path: Path
) -> None:
    client, api = _deploy(one_node, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    job_id = _submit(client, api, events, [0, "gil"], batch_timeout=1)

    final = client.wait(api, job_id, timeout=150)

    assert final["status"] == "status_completed_with_failures", final
    [failed] = client.failed_batches(api, job_id)
    assert failed["index"] == 1 and "died" in failed["error"]  # counted as lost deliveries: its tries, plus two
    tries = [e for e in _events(events) if e["event"] == "predict" and e["items"] == ["gil"]]
    assert len(tries) == 3 and len({e["pid"] for e in tries}) == 3
    assert not any(_alive(e["pid"]) for e in tries)
    next_job = _submit(client, api, events, [10])
    assert client.wait(api, next_job, timeout=60)["status"] == "status_succeeded"


def test_a_batch_running_past_the_visibility_timeout_is_not_delivered_again_while_its_node_lives(
    two_nodes_short_visibility: Stack, tmp_path: Path,
) -> None:
    """kombu re-queues a message unacknowledged for the visibility timeout; the node's heartbeat
    keeps the message of a batch it still runs from looking abandoned."""
    from kombu import Connection

    from jobs.transport.broker import TRANSPORT_PATH

    stack = two_nodes_short_visibility
    client, api = _deploy(stack, tmp_path / "project")
    events = tmp_path / "events.jsonl"
    gate = tmp_path / "gate"
    job_id = _submit(client, api, events, [f"gate:{gate}"], workers=2)
    try:
        [started] = _wait_for(lambda: _events(events), 60, "the batch to start")
        # The message was delivered before the batch started: once that is longer ago than the
        # visibility timeout, only the node's heartbeat keeps it from looking abandoned.
        _wait_for(lambda: time.time() > started["t"] + SHORT_VISIBILITY_S + 0.5, 30,
                  "the batch's message to be unacknowledged for longer than the visibility timeout")
        broker = redis.Redis.from_url(stack.redis_url or "")
        with Connection(stack.redis_url, transport=TRANSPORT_PATH,
                        transport_options={"visibility_timeout": SHORT_VISIBILITY_S}) as connection:
            channel = connection.default_channel
            [tag] = broker.hkeys(channel.unacked_key)
            # What the sweep below takes for abandoned: an unacknowledged message whose index entry
            # is older than the visibility timeout. The node keeps its batch's entry newer than that.
            assert broker.zrangebyscore(channel.unacked_index_key, "-inf", time.time() - SHORT_VISIBILITY_S) == []
            assert broker.zscore(channel.unacked_index_key, tag) is not None
            # What every worker's periodic sweep does (every ~100 s by default): re-queue what looks abandoned.
            channel.qos.restore_visible(num=100, interval=1)
    finally:
        gate.touch()  # the batch ends
    assert client.wait_job(api, job_id, timeout=60)["status"] == "status_succeeded"
    assert len([e for e in _events(events) if e["event"] == "predict"]) == 1
    assert len([e for e in _events(events) if e["event"] == "complete"]) == 1
