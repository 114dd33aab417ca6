"""The broker transport against Redis: kombu's Redis channel, with one client per channel for its own
commands (`jobs/transport/broker.py`), and the task messages made from what it keeps instead of sending
(`jobs/transport/task_messages.py`); which URLs get it is tested in tests/unit/test_broker.py."""

from __future__ import annotations

import base64
import json

import redis
from kombu import Connection, Queue

from foundation.settings import Settings
from jobs.celery_app import create_celery
from jobs.tasks import RUN_ASYNC
from jobs.transport.broker import TRANSPORT_PATH, Channel
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
