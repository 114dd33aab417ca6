"""A batch message's broker receipt: the transport leaves writing it into kombu's unacknowledged hash
to the batch's begin, and removing it to the batch's record, writing only what they did not
(`jobs/transport/broker.py` `ReceiptQoS`, `jobs/transport/delivery.py`). Against a recording fake of
the channel's Redis client; tests/integration/test_broker_redis.py runs the same against Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kombu.transport import redis as kombu_redis
from kombu.utils import json as kombu_json

from jobs.tasks import RUN_BATCH
from jobs.transport.broker import RECEIPT_TASK, Channel, ReceiptQoS, SentinelChannel, receipt_for
from jobs.transport.delivery import BROKER_UNACKED, BROKER_UNACKED_INDEX


class Pipe:
    def __init__(self, sent: list[tuple[Any, ...]]) -> None:
        self.sent, self.queued = sent, []

    def __getattr__(self, command: str) -> Any:
        def queue(*args: Any, **kwargs: Any) -> Pipe:
            self.queued.append((command, *args))
            return self
        return queue

    def execute(self) -> list[Any]:
        self.sent.extend(self.queued)
        return [1] * len(self.queued)


class FakeChannel:
    """What kombu's Redis QoS uses of its channel: its key names and a client's pipelines."""

    unacked_key, unacked_index_key = "unacked", "unacked_index"
    unacked_mutex_key, unacked_mutex_expire, visibility_timeout = "unacked_mutex", 300, 3600
    do_restore = False  # kombu restores held messages at exit unless told not to

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        yield self

    def pipeline(self) -> Pipe:
        return Pipe(self.sent)


class Message:
    def __init__(self, tag: str, task: str = RUN_BATCH) -> None:
        self.headers = {"task": task, "id": f"task-{tag}"}
        self.delivery_tag = tag
        self.delivery_info = {"exchange": "job.j1", "routing_key": "job.j1"}
        self._raw = {"body": "e30=", "headers": self.headers, "properties": {"delivery_tag": tag}}


def qos(prefetch: int = 1) -> tuple[ReceiptQoS, FakeChannel]:
    channel = FakeChannel()
    return ReceiptQoS(channel, prefetch_count=prefetch), channel


def test_the_receipt_names_kombus_keys_and_celerys_batch_task() -> None:
    assert kombu_redis.Channel.unacked_key == BROKER_UNACKED
    assert kombu_redis.Channel.unacked_index_key == BROKER_UNACKED_INDEX
    assert RECEIPT_TASK == RUN_BATCH
    assert Channel.QoS is ReceiptQoS and SentinelChannel.QoS is ReceiptQoS


def test_a_batch_taken_to_run_at_once_is_written_by_its_begin_not_by_the_transport() -> None:
    transport, channel = qos()

    transport.append(Message("t1"), "t1")

    receipt = receipt_for("task-t1")
    assert channel.sent == []
    assert receipt is not None and not receipt.written and receipt.unacked.startswith("[{")
    assert transport.can_consume() is False  # held, as kombu holds a message it took


@pytest.mark.parametrize("extra", [{}, {"big": 2**70, "text": "é\u2028"}], ids=["usual", "past orjson"])
def test_the_kept_entry_reads_back_as_the_entry_kombu_writes(extra: dict[str, Any]) -> None:
    transport, _ = qos()
    message = Message("t-entry")
    message.headers.update(extra)

    transport.append(message, "t-entry")

    receipt = receipt_for("task-t-entry")
    assert receipt is not None
    kombus = json.dumps([message._raw, "job.j1", "job.j1"])  # what kombu's QoS.append writes
    assert kombu_json.loads(receipt.unacked) == kombu_json.loads(kombus)


def test_a_batch_its_record_acknowledged_is_acknowledged_without_a_write() -> None:
    transport, channel = qos()
    transport.append(Message("t2"), "t2")
    receipt = receipt_for("task-t2")
    assert receipt is not None
    receipt.written = receipt.acknowledged = True  # what begin and record did

    transport.ack("t2")

    assert channel.sent == [] and receipt_for("task-t2") is None and transport.can_consume()


def test_a_batch_acknowledged_before_its_begin_wrote_anything_needs_no_write_either() -> None:
    transport, channel = qos()
    transport.append(Message("t3"), "t3")

    transport.ack("t3")

    assert channel.sent == []


def test_a_batch_rejected_before_its_begin_is_written_first_so_it_can_be_put_back() -> None:
    transport, channel = qos()
    transport.append(Message("t4"), "t4")

    transport.reject("t4", requeue=False)

    assert [c[0] for c in channel.sent] == ["zadd", "hset", "zrem", "hdel"]
    assert channel.sent[1][1:3] == ("unacked", "t4")


def test_a_batch_begun_and_not_recorded_is_acknowledged_as_kombu_does() -> None:
    transport, channel = qos()
    transport.append(Message("t5"), "t5")
    receipt = receipt_for("task-t5")
    assert receipt is not None
    receipt.written = True  # begun; its record never came (the task failed)

    transport.ack("t5")

    assert [c[0] for c in channel.sent] == ["zrem", "hdel"]


@pytest.mark.parametrize(("task", "prefetch"), [("sluice.finish_job", 1), (RUN_BATCH, 2)])
def test_other_tasks_and_batches_held_ahead_are_written_when_taken(task: str, prefetch: int) -> None:
    transport, channel = qos(prefetch)

    transport.append(Message("t6", task), "t6")

    assert [c[0] for c in channel.sent] == ["zadd", "hset"]
    receipt = receipt_for("task-t6")
    assert receipt is None if task != RUN_BATCH else (receipt is not None and receipt.written)
    transport.ack("t6")


def test_a_shutdown_writes_what_it_holds_before_putting_it_back() -> None:
    transport, channel = qos()
    transport.append(Message("t7"), "t7")
    restored: list[str] = []
    transport.restore_by_tag = lambda tag, client=None, leftmost=False: restored.append(tag)  # type: ignore[method-assign]

    transport.restore_unacked()

    assert [c[0] for c in channel.sent] == ["zadd", "hset"] and restored == ["t7"]
