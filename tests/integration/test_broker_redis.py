"""The broker transport against Redis: kombu's Redis channel, with one client per channel for its own
commands and batch messages whose unacknowledged entry the batch's begin writes and its record
removes (`jobs/transport/broker.py`), and the task messages made from what it keeps instead of sending
(`jobs/transport/task_messages.py`); which URLs get it is tested in tests/unit/test_broker.py."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis
from kombu import Connection, Queue

from foundation.settings import Settings
from jobs.celery_app import create_celery
from jobs.store.ledger import RedisBatchLedger
from jobs.tasks import RUN_ASYNC, RUN_BATCH
from jobs.transport.broker import TRANSPORT_PATH, Channel, queue_lengths, queue_lists, receipt_for
from jobs.transport.delivery import Delivery
from jobs.transport.task_messages import TaskMessages


def test_the_celery_app_connects_through_the_sluice_channel(redis_server):
    app = create_celery(Settings(redis_url=redis_server))

    with app.connection_for_write() as connection:
        assert isinstance(connection.default_channel, Channel)


def test_many_publishes_and_acks_build_one_client_and_leave_nothing_unacked(redis_server):
    built = []
    with Connection(redis_server, transport=TRANSPORT_PATH) as connection:
        channel = connection.default_channel
        create = channel._create_client
        channel._create_client = lambda *a, **k: built.append(1) or create(*a, **k)
        queue = Queue("broker-test", routing_key="broker-test")
        with connection.SimpleQueue(queue) as simple:
            for n in range(50):
                simple.put({"n": n})
            received = []
            for _ in range(50):
                message = simple.get(timeout=5)
                received.append(message.payload["n"])
                message.ack()
        unacked = channel.client.hlen(channel.unacked_key)

    assert sorted(received) == list(range(50))
    assert unacked == 0
    assert len(built) == 1


def test_a_task_message_made_from_celerys_template_is_the_one_celery_sends_but_for_its_delivery_tag(redis_server):
    app = create_celery(Settings(redis_url=redis_server))
    client = redis.Redis.from_url(redis_server)
    client.delete("async.echo")
    ours = TaskMessages(app).message(RUN_ASYNC, ("echo", "r-7"), "async.echo", task_id="task-7")
    assert ours is not None and ours.key == "async.echo"
    assert client.llen("async.echo") == 0  # the template Celery made was kept, not sent
    app.send_task(RUN_ASYNC, args=("echo", "r-7"), queue="async.echo", task_id="task-7", ignore_result=True,
                  add_to_parent=False)
    theirs, mine = json.loads(client.rpop("async.echo")), json.loads(ours.payload)
    assert theirs["properties"].pop("delivery_tag") != mine["properties"].pop("delivery_tag")  # each its own
    assert json.loads(base64.b64decode(theirs.pop("body"))) == json.loads(base64.b64decode(mine.pop("body")))
    assert theirs == mine
    other = TaskMessages(app).message(RUN_ASYNC, ("echo", "r-8"), "async.echo")
    assert other is not None and json.loads(other.payload)["headers"]["id"] != "task-7"  # a new id unless given


def batch_message_taken(connection: Connection, queue_name: str, prefetch: int = 1) -> Any:
    """A `run_batch` message published on `queue_name`, then taken by a consumer reserving `prefetch` at a time."""
    queue = Queue(queue_name, routing_key=queue_name)
    simple = connection.SimpleQueue(queue)
    simple.consumer.qos(prefetch_count=prefetch)
    simple.put({"args": ["j1", 0]}, headers={"task": RUN_BATCH, "id": f"task-{queue_name}"})
    return simple, simple.get(timeout=5)


def test_a_batch_message_is_written_unacked_by_its_begin_and_acknowledged_by_its_record(redis_server):
    client = redis.Redis.from_url(redis_server)
    ledger = RedisBatchLedger(client)
    with Connection(redis_server, transport=TRANSPORT_PATH) as connection:
        simple, message = batch_message_taken(connection, "receipt-test")
        tag = message.delivery_tag
        assert client.hget(Channel.unacked_key, tag) is None  # taken, its entry left to the begin

        receipt = receipt_for("task-receipt-test")  # what the task knows of its message: its id
        delivery = Delivery("node-1", "task-receipt-test", receipt)
        ledger.begin_batch("no-such-job", 0, delivery)
        entry = json.loads(client.hget(Channel.unacked_key, tag))
        assert entry[0]["headers"]["task"] == RUN_BATCH  # as kombu writes it: the message, exchange, routing key
        assert entry[1:] == [message.delivery_info["exchange"], message.delivery_info["routing_key"]]
        assert client.zscore(Channel.unacked_index_key, tag) is not None

        ledger.record_success("no-such-job", 0, 0.01, delivery)
        assert client.hget(Channel.unacked_key, tag) is None
        assert client.zscore(Channel.unacked_index_key, tag) is None
        zrem_before = client.info("commandstats").get("cmdstat_zrem", {}).get("calls", 0)
        message.ack()
        assert client.info("commandstats").get("cmdstat_zrem", {}).get("calls", 0) == zrem_before  # no round trip
        simple.close()


def test_a_batch_message_acknowledged_while_its_record_is_on_its_way_leaves_the_ack_to_the_record(redis_server):
    client = redis.Redis.from_url(redis_server)
    ledger = RedisBatchLedger(client)
    with Connection(redis_server, transport=TRANSPORT_PATH) as connection:
        simple, message = batch_message_taken(connection, "receipt-sent")
        tag = message.delivery_tag
        delivery = Delivery("node-1", "task-receipt-sent", receipt_for("task-receipt-sent"))
        started = ledger.send_begin_batch("no-such-job", 0, delivery)
        started.answer()
        assert client.hget(Channel.unacked_key, tag) is not None  # written by the begin

        sent = ledger.send_record_success("no-such-job", 0, 0.01, delivery)
        zrem_before = client.info("commandstats").get("cmdstat_zrem", {}).get("calls", 0)
        message.ack()  # Celery acknowledges as the task returns, before the record's answer is read
        assert client.info("commandstats").get("cmdstat_zrem", {}).get("calls", 0) == zrem_before
        sent.answer()
        assert client.hget(Channel.unacked_key, tag) is None  # the record removed it
        assert client.zscore(Channel.unacked_index_key, tag) is None
        simple.close()


def test_a_batch_message_rejected_before_its_begin_goes_back_on_its_queue(redis_server):
    client = redis.Redis.from_url(redis_server)
    with Connection(redis_server, transport=TRANSPORT_PATH) as connection:
        simple, message = batch_message_taken(connection, "receipt-requeue")

        message.requeue()

        assert client.llen("receipt-requeue") == 1 and client.hlen(Channel.unacked_key) == 0
        simple.close()


def test_a_batch_message_held_when_the_consumer_closes_goes_back_on_its_queue(redis_server):
    client = redis.Redis.from_url(redis_server)
    with Connection(redis_server, transport=TRANSPORT_PATH) as connection:
        simple, _held = batch_message_taken(connection, "receipt-shutdown")
        assert client.llen("receipt-shutdown") == 0
        connection.default_channel.qos.restore_unacked_once()  # what a warm shutdown runs

        assert client.llen("receipt-shutdown") == 1
        simple.close()


def test_a_batch_message_taken_ahead_of_its_run_is_written_unacked_at_once(redis_server):
    client = redis.Redis.from_url(redis_server)
    with Connection(redis_server, transport=TRANSPORT_PATH) as connection:
        simple, message = batch_message_taken(connection, "receipt-ahead", prefetch=2)

        assert client.hget(Channel.unacked_key, message.delivery_tag) is not None
        message.ack()
        assert client.hget(Channel.unacked_key, message.delivery_tag) is None
        simple.close()


def test_a_batch_the_publisher_queues_is_the_message_celery_sends_but_for_its_ids(redis_server):
    from jobs.batch.publish import BatchPublisher

    app = create_celery(Settings(redis_url=redis_server))
    client = redis.Redis.from_url(redis_server)
    queue, args = "job.j-publish", ("j-publish", 3, None, {"uri": "/d/x.jsonl", "start": 0, "end": 9, "lines": 2})
    client.delete(queue)
    with BatchPublisher(app, "j-publish", queue) as publisher:
        publisher.batch(*args[1:])
    app.send_task(RUN_BATCH, args=args, queue=queue, ignore_result=True, add_to_parent=False, argsrepr="",
                  kwargsrepr="")
    ours, theirs = (json.loads(raw) for raw in client.rpop(queue, 2))  # the first pushed, first

    assert publisher.published == 1 and client.llen(queue) == 0
    assert ours["headers"]["argsrepr"] == ""  # the payload is not rendered for monitoring
    for message in (theirs, ours):
        for key in ("delivery_tag", "correlation_id", "argsrepr", "kwargsrepr"):  # its own ids; how Celery
            message["properties"].pop(key, None)  # renders its arguments (also into its properties) aside
        for key in ("id", "root_id", "argsrepr", "kwargsrepr"):
            message["headers"].pop(key)
    assert json.loads(base64.b64decode(theirs.pop("body"))) == json.loads(base64.b64decode(ours.pop("body")))
    assert theirs == ours


def test_batches_published_across_a_dropped_connection_are_queued_once_each(redis_server):
    from jobs.batch.publish import PIPELINE, BatchPublisher

    app = create_celery(Settings(redis_url=redis_server))
    client = redis.Redis.from_url(redis_server)
    queue = "job.j-dropped"
    client.delete(queue)
    with BatchPublisher(app, "j-dropped", queue) as publisher:
        publisher.batch(0, [0], None)
        client.client_kill_filter(_type="normal", skipme=True)  # every connection but this one, the publisher's too
        for index in range(1, PIPELINE + 2):
            publisher.batch(index, [index], None)

    indexes = [json.loads(base64.b64decode(json.loads(raw)["body"]))[0][1] for raw in client.lrange(queue, 0, -1)]
    assert sorted(indexes) == list(range(PIPELINE + 2))



def test_a_queue_is_one_list_a_node_reads_whatever_priority_a_message_was_sent_with(redis_server):
    """kombu keeps one list per priority level a channel knows; Sluice's channels know one, so a node's
    BRPOP names one key per queue, and a message sent with a priority still lands where nodes read."""
    app = create_celery(Settings(redis_url=redis_server))
    client = redis.Redis.from_url(redis_server)
    client.delete("prio-test")

    with app.connection_for_write() as connection:
        channel = connection.default_channel
        lists = queue_lists(channel, "prio-test")
        app.send_task(RUN_ASYNC, args=("echo", "r-1"), queue="prio-test", priority=9, ignore_result=True)
        app.send_task(RUN_ASYNC, args=("echo", "r-2"), queue="prio-test", ignore_result=True)
        waiting = queue_lengths(channel, ["prio-test"])

    assert lists == ["prio-test"]
    assert client.llen("prio-test") == 2 and waiting == {"prio-test": 2}
    assert sorted(key for key in client.keys("prio-test*")) == [b"prio-test"]


def test_with_task_events_on_the_template_celery_makes_is_announced_to_no_monitor(redis_server, monkeypatch):
    from celery.events.dispatcher import EventDispatcher

    announced: list[str] = []
    publish = EventDispatcher.publish
    monkeypatch.setattr(EventDispatcher, "publish",
                        lambda self, type, fields, *a, **k: announced.append(fields.get("uuid", type))
                        or publish(self, type, fields, *a, **k))
    app = create_celery(Settings(redis_url=redis_server, task_events=True))
    assert app.conf.task_send_sent_event  # Celery announces each task it sends

    made = TaskMessages(app).message(RUN_ASYNC, ("echo", "r-9"), "async.events", task_id="task-9")

    assert made is not None and json.loads(made.payload)["headers"]["id"] == "task-9"
    assert "sluice-template" not in announced  # no `sluice-template` task pending forever in Flower
