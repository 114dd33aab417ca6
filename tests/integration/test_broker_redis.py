"""The broker transport against Redis: kombu's Redis channel, with one client per channel for its own
commands (`jobs/broker.py`); which URLs get it is tested in tests/unit/test_broker.py."""

from __future__ import annotations

from kombu import Connection, Queue

from foundation.settings import Settings
from jobs.broker import TRANSPORT_PATH, Channel
from jobs.celery_app import create_celery


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
