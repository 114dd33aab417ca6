"""Redis clients by policy, and riding out Redis stalls: a command is sent again for a while.

The clock is driven here; the tests that stop a real redis-server (SIGSTOP) and check that a
repeated store call is answered as its first run was are in tests/integration/test_redis_stalls.py.
"""

from __future__ import annotations

import pytest
import redis

from foundation.errors import BadRequest, NotReady
from foundation.redis_clients import (
    BACKGROUND,
    HEARTBEAT,
    KEEPALIVE_OPTIONS,
    STORE,
    ClientPolicy,
    RedisUnavailable,
    RideOut,
    background_client,
    client,
    connect,
    heartbeat_client,
    one_line,
    store_client,
)
from foundation.settings import Settings


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def failing(times: int, error: Exception, clock: FakeClock | None = None, cost_s: float = 0.0):
    calls = {"n": 0}

    def call() -> str:
        calls["n"] += 1
        if clock is not None:
            clock.now += cost_s
        if calls["n"] <= times:
            raise error
        return "answered"

    return call, calls


def test_a_command_is_sent_again_with_growing_pauses_until_redis_answers() -> None:
    clock = FakeClock()
    retry = RideOut(30, sleep=clock.sleep, clock=clock)
    call, calls = failing(6, redis.ConnectionError("refused"))
    failures: list[Exception] = []

    assert retry.call_with_retry(call, failures.append) == "answered"

    assert calls["n"] == 7 and len(failures) == 6
    assert clock.slept == sorted(clock.slept) and clock.slept[0] == pytest.approx(0.05)
    assert max(clock.slept) <= 1.0


def test_redis_unanswered_for_the_whole_window_is_reported_in_one_line() -> None:
    clock = FakeClock()
    retry = RideOut(30, sleep=clock.sleep, clock=clock)
    call, calls = failing(1000, redis.TimeoutError("Timeout reading from socket"), clock, cost_s=5.0)

    with pytest.raises(RedisUnavailable) as raised:
        retry.call_with_retry(call, lambda error: None)

    assert 30 <= clock.now <= 30 + 5 + 1  # tries of 5 s each (a socket timeout) fill the window, one more at most
    assert calls["n"] in (6, 7)
    assert str(raised.value) == "Redis did not answer for 30 s (TimeoutError: Timeout reading from socket)"
    assert isinstance(raised.value, NotReady) and isinstance(raised.value, redis.ConnectionError)
    assert isinstance(raised.value.__cause__, redis.TimeoutError)


def test_a_wrong_password_is_not_retried() -> None:
    clock = FakeClock()
    call, calls = failing(5, redis.AuthenticationError("invalid password"))

    with pytest.raises(redis.AuthenticationError):
        RideOut(30, sleep=clock.sleep, clock=clock).call_with_retry(call, lambda error: None)

    assert calls["n"] == 1


def test_a_command_redis_refuses_is_not_retried() -> None:
    call, calls = failing(5, redis.ResponseError("WRONGTYPE"))

    with pytest.raises(redis.ResponseError):
        RideOut(30, sleep=lambda s: None).call_with_retry(call, lambda error: None)

    assert calls["n"] == 1


def test_what_went_wrong_is_said_in_one_line() -> None:
    assert one_line(BadRequest("line 3 of s3://b/x.jsonl is not JSON")) == "line 3 of s3://b/x.jsonl is not JSON"
    assert one_line(redis.TimeoutError("Timeout reading\nfrom socket")) == (
        "Redis failed: TimeoutError: Timeout reading from socket"
    )
    assert one_line(ValueError()) == "ValueError"


def test_the_retry_window_is_a_setting_of_30_seconds_by_default() -> None:
    assert Settings.from_env({}).redis_retry_s == 30
    assert Settings.from_env({"SLUICE_REDIS_RETRY_S": "5"}).redis_retry_s == 5


# -- clients by policy ---------------------------------------------------------------------------
SETTINGS = Settings(redis_url="redis://10.0.0.9:6380/2", redis_retry_s=12)


def options_of(built: redis.Redis) -> dict[str, object]:
    """What every connection of `built` is made with (building one connects nothing)."""
    return dict(built.connection_pool.connection_kwargs)


@pytest.mark.parametrize("make", [store_client, heartbeat_client, background_client])
def test_every_client_waits_a_bounded_time_and_keeps_its_connections_alive(make) -> None:
    options = options_of(make(SETTINGS))

    assert (options["host"], options["port"], options["db"]) == ("10.0.0.9", 6380, 2)
    assert 0 < options["socket_timeout"] <= 5 and 0 < options["socket_connect_timeout"] <= 5  # type: ignore[operator]
    assert options["socket_keepalive"] is True and options["socket_keepalive_options"] == KEEPALIVE_OPTIONS
    assert KEEPALIVE_OPTIONS  # this platform can tune probes: a vanished peer is noticed in about 45 s


def test_the_stores_client_rides_out_stalls_for_the_deployments_retry_window() -> None:
    options = options_of(store_client(SETTINGS))

    assert isinstance(options["retry"], RideOut) and options["retry"].within_s == 12
    assert options["health_check_interval"] == STORE.health_check_interval_s == 30


def test_heartbeats_and_flushes_send_a_command_once() -> None:
    heartbeat, background = options_of(heartbeat_client(SETTINGS)), options_of(background_client(SETTINGS))

    assert heartbeat["retry"].get_retries() == 0 and background["retry"].get_retries() == 0  # type: ignore[attr-defined]
    assert heartbeat["health_check_interval"] == HEARTBEAT.health_check_interval_s == 30
    assert background["socket_timeout"] == BACKGROUND.socket_timeout_s < HEARTBEAT.socket_timeout_s


def test_a_client_of_a_policy_takes_redis_pys_own_options_over_the_policys() -> None:
    options = options_of(connect("redis://127.0.0.1:7000/0", 10, socket_timeout=0.3))
    custom = options_of(client("redis://127.0.0.1:7000/0", ClientPolicy("test", 1.0, 0.5, retry_s=3)))

    assert options["socket_timeout"] == 0.3 and options["retry"].within_s == 10  # type: ignore[attr-defined]
    assert options["socket_keepalive"] is True
    assert (custom["socket_timeout"], custom["socket_connect_timeout"]) == (1.0, 0.5)
    assert custom["retry"].within_s == 3 and custom["health_check_interval"] == 0  # type: ignore[attr-defined]


def test_a_process_that_is_stopping_stops_riding_out_at_the_next_failure(monkeypatch) -> None:
    from foundation import redis_clients

    monkeypatch.setattr(redis_clients, "_STOPPING", redis_clients.threading.Event())
    clock = FakeClock()
    retry = RideOut(30, sleep=clock.sleep, clock=clock)
    call, calls = failing(100, redis.ConnectionError("refused"), clock)
    assert not redis_clients.riding_out_stopped()

    redis_clients.stop_riding_out()

    with pytest.raises(RedisUnavailable, match="did not answer, and this process is stopping"):
        retry.call_with_retry(call, lambda error: None)
    assert calls["n"] == 1 and clock.slept == []
    assert redis_clients.riding_out_stopped()
