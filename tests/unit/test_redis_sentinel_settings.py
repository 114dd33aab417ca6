"""Redis Sentinel as a deployment's Redis: the settings, checked at the edge, and what they build.

A deployment names its sentinels and the primary they watch; every client (by policy) and the
broker then find the primary through them. The failover itself, on real redis-server and
sentinel processes, is tests/integration/test_sentinel_failover.py.
"""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

from foundation.errors import ConfigError
from foundation.redis_clients import (
    HEARTBEAT,
    KEEPALIVE_OPTIONS,
    STORE,
    FollowingPrimaryConnection,
    RideOut,
    client,
    store_client,
)
from foundation.settings import RedisAddress, Settings
from jobs.nodes.stall_watch import StallWatch
from jobs.transport.broker import SENTINEL_TRANSPORT_PATH, broker_url, transport_for, transport_options

SENTINELS = {"SLUICE_REDIS_SENTINELS": "10.0.0.1:26379, 10.0.0.2:26380,[fd00::3]:26381",
             "SLUICE_REDIS_MASTER": "sluice"}


def test_an_operator_names_the_sentinels_and_the_primary_they_watch() -> None:
    settings = Settings.from_env({**SENTINELS, "SLUICE_REDIS_PASSWORD": "pw", "SLUICE_REDIS_SENTINEL_PASSWORD": "spw"})

    address = settings.redis_address
    assert address.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("fd00::3", 26381))
    assert address.master == "sluice"
    assert (address.password, address.sentinel_password) == ("pw", "spw")
    assert "pw" not in repr(settings) and "pw" not in str(address)  # secrets stay out of logs
    assert "10.0.0.1:26379" in str(address)


@pytest.mark.parametrize(
    "env, named",
    [
        ({"SLUICE_REDIS_SENTINELS": "10.0.0.1"}, "SLUICE_REDIS_SENTINELS"),  # no port
        ({"SLUICE_REDIS_SENTINELS": "10.0.0.1:http"}, "SLUICE_REDIS_SENTINELS"),
        ({"SLUICE_REDIS_SENTINELS": "10.0.0.1:70000"}, "SLUICE_REDIS_SENTINELS"),
        ({"SLUICE_REDIS_SENTINELS": ":26379"}, "SLUICE_REDIS_SENTINELS"),
        ({"SLUICE_REDIS_SENTINELS": "10.0.0.1:26379"}, "SLUICE_REDIS_MASTER"),  # which primary?
        ({**SENTINELS, "SLUICE_REDIS_URL": "redis://10.0.0.9:6379/0"}, "SLUICE_REDIS_URL"),  # which Redis?
        ({"SLUICE_REDIS_MASTER": "sluice"}, "SLUICE_REDIS_MASTER"),  # sentinels forgotten
        ({"SLUICE_REDIS_SENTINEL_PASSWORD": "spw"}, "SLUICE_REDIS_SENTINEL_PASSWORD"),
    ],
)
def test_a_bad_redis_setting_is_refused_at_start_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Settings.from_env(env)


def test_without_sentinels_the_url_is_redis_and_the_password_joins_it() -> None:
    settings = Settings.from_env({"SLUICE_REDIS_URL": "redis://10.0.0.9:6379/2", "SLUICE_REDIS_PASSWORD": "p@ss"})
    assert settings.redis_address.sentinels == ()
    assert broker_url(settings.redis_address) == "redis://:p%40ss@10.0.0.9:6379/2"
    # A password already in the URL is the one used.
    assert broker_url(RedisAddress("redis://:own@h:6379/0", password="other")) == "redis://:own@h:6379/0"
    assert client(settings.redis_address, HEARTBEAT).connection_pool.connection_kwargs["password"] == "p@ss"


def test_the_broker_finds_the_primary_through_the_sentinels() -> None:
    settings = Settings.from_env({**SENTINELS, "SLUICE_REDIS_PASSWORD": "pw", "SLUICE_REDIS_SENTINEL_PASSWORD": "spw"})

    url = broker_url(settings.redis_address)
    assert url == "sentinel://:pw@10.0.0.1:26379/0;sentinel://10.0.0.2:26380;sentinel://[fd00::3]:26381"
    assert transport_for(url) == SENTINEL_TRANSPORT_PATH
    options = transport_options(settings)
    assert options["master_name"] == "sluice"
    assert options["sentinel_kwargs"]["password"] == "spw"
    # Every socket, to the sentinels and to the primary, times out and is kept alive.
    for socket_options in (options, options["sentinel_kwargs"]):
        assert socket_options["socket_timeout"] > 0 and socket_options["socket_connect_timeout"] > 0
        assert socket_options["socket_keepalive"] is True
    assert options["health_check_interval"] > 0
    assert "retry_on_timeout" not in options  # kombu pipelines a job's publishes only without it


def test_a_celery_app_of_a_sentinel_deployment_uses_kombus_sentinel_transport() -> None:
    from jobs.celery_app import create_celery

    app = create_celery(Settings.from_env(SENTINELS))
    assert app.conf.broker_transport == SENTINEL_TRANSPORT_PATH
    assert app.conf.broker_transport_options["master_name"] == "sluice"
    assert app.connection_for_write().alt == [  # each sentinel is asked in turn
        "sentinel://10.0.0.1:26379/0", "sentinel://10.0.0.2:26380", "sentinel://[fd00::3]:26381"]


def test_a_client_of_a_sentinel_deployment_keeps_its_policy() -> None:
    settings = Settings.from_env({**SENTINELS, "SLUICE_REDIS_SENTINEL_PASSWORD": "spw", "SLUICE_REDIS_RETRY_S": "12"})

    store = store_client(settings)
    pool = store.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "sluice"
    kwargs = pool.connection_kwargs
    assert kwargs["socket_timeout"] == STORE.socket_timeout_s and kwargs["socket_keepalive"] is True
    assert kwargs["socket_keepalive_options"] == KEEPALIVE_OPTIONS
    assert kwargs["retry"] == RideOut(12.0)  # rides out a failover as it rides out a restart
    sentinel = pool.sentinel_manager.sentinels[0]
    sentinel_kwargs = sentinel.connection_pool.connection_kwargs
    assert sentinel_kwargs["password"] == "spw" and sentinel_kwargs["socket_timeout"] == STORE.socket_timeout_s


def test_a_connection_dropped_mid_command_reconnects_to_the_primary_the_sentinels_name_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py reconnects a retried command's connection to the address it had; ours asks first."""
    store = store_client(Settings.from_env(SENTINELS))
    pool = store.connection_pool
    assert pool.connection_class is FollowingPrimaryConnection
    promoted = ("127.0.0.1", 6380)
    pool.proxy.get_master_address = lambda: promoted  # type: ignore[method-assign]
    dialled: list[tuple[str, int, bool]] = []

    def dial(self: SentinelManagedConnection, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        # redis-py's own connect, where no fast test may go: note where it would dial, and how
        dialled.append((self.host, self.port, retry_socket_connect))

    monkeypatch.setattr(SentinelManagedConnection, "connect_check_health", dial)
    connection = pool.make_connection()
    connection.host, connection.port = "127.0.0.1", 6379  # the primary it reached before the failover

    connection.connect_check_health(check_health=False)

    # to the promoted server, once: the command's retry (RideOut) repeats it, not the socket's
    assert dialled == [("127.0.0.1", 6380, False)]


def test_a_demoted_primary_answering_readonly_is_ridden_out() -> None:
    clock = [0.0]
    ride_out = RideOut(5.0, sleep=lambda s: clock.__setitem__(0, clock[0] + s), clock=lambda: clock[0])
    answers = iter([redis.ReadOnlyError("You can't write against a read only replica."), "OK"])

    def command() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert ride_out.call_with_retry(command, lambda error: None) == "OK"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_node_idle_with_messages_waiting_past_the_stall_time_is_stalled() -> None:
    clock = Clock()
    watch = StallWatch(60.0, clock)
    clock.now += 59
    assert not watch.stalled(busy=False, waiting=3)
    clock.now += 1
    assert watch.stalled(busy=False, waiting=3)


@pytest.mark.parametrize("event", ["busy", "empty queues", "a message taken", "queues unreadable"])
def test_a_node_that_takes_work_or_has_none_is_not_stalled(event: str) -> None:
    clock = Clock()
    watch = StallWatch(60.0, clock)
    clock.now += 50
    if event == "busy":
        watch.stalled(busy=True, waiting=0)
    elif event == "empty queues":
        watch.stalled(busy=False, waiting=0)
    else:
        watch.restart()
    clock.now += 50  # 100 s since start, 50 since the node last made progress
    assert not watch.stalled(busy=False, waiting=3)
    clock.now += 10
    assert watch.stalled(busy=False, waiting=3)
