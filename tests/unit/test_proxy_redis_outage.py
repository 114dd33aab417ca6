"""The proxy keeps routing a live replica through a Redis outage (a restart, a Sentinel failover):
time in which it could not read Redis is not held against the replicas' heartbeats.

The controller's routes are rendered from in-memory fakes of the registry and the replica
directory (`foundation.memory`), made unreachable as Redis would be; no haproxy is started.
The same story on real processes is tests/integration/test_sentinel_failover.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from foundation.figures import Recorder
from foundation.memory import MemoryApiRegistry, MemoryFigureStore, MemoryReplicaDirectory
from foundation.replica_directory import REPLICA_TTL_S, ReplicaRecord
from foundation.settings import Settings
from predictors_runtime.config import ApiConfig
from sluice.haproxy import HAProxy
from sluice.proxy import ProxyController, SilenceAllowance

KILLED = 1000.0  # the Redis primary dies; the replica was last heard from just before


class NoRedis:
    """The controller's own client: these tests only render routes, which read the fakes."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"Redis was used ({name})")


@pytest.fixture
def replicas() -> MemoryReplicaDirectory:
    directory = MemoryReplicaDirectory()
    directory.announce(ReplicaRecord(replica_id="iris-1", api="iris", bundle="b1", host="127.0.0.1", port=9001,
                                     processes=1, ready=True, draining=False, seen=KILLED - 0.5))
    return directory


@pytest.fixture
def controller(tmp_path: Path, replicas: MemoryReplicaDirectory) -> ProxyController:
    registry = MemoryApiRegistry()
    registry.put(ApiConfig.from_dict({"name": "iris", "kind": "RealtimeAPI", "predictor": {"path": "p.py"}}), "b1")
    return ProxyController(NoRedis(), port=1, management="127.0.0.1:2",  # type: ignore[arg-type]
                           state_dir=tmp_path / "proxy", settings=Settings(), registry=registry,
                           replicas=replicas, recorder=Recorder(MemoryFigureStore()))


def routed(controller: ProxyController, now: float) -> list[str]:
    _, routes = controller._render(now)
    return [replica_id for route in routes for replica_id in route.replica_ids]


def outage(controller: ProxyController, replicas: MemoryReplicaDirectory, until: float) -> None:
    """Redis unreachable from `KILLED` to `until`, the controller failing a turn every 0.3 s."""
    assert isinstance(controller.registry, MemoryApiRegistry)
    controller.registry.unreachable = replicas.unreachable = True
    now = KILLED
    while now < until:
        with pytest.raises(redis.ConnectionError):
            controller._render(now)
        now += 0.3
    controller.registry.unreachable = replicas.unreachable = False


def test_a_replica_silent_only_while_redis_was_away_stays_routed_when_redis_answers_again(controller, replicas):
    assert routed(controller, KILLED - 0.2) == ["iris-1"]
    outage(controller, replicas, until=KILLED + 8)  # longer than a replica's allowance of 5 s

    # Its launcher could not announce it either: the record is 8.5 s old, and still routed.
    assert routed(controller, KILLED + 8.2) == ["iris-1"]
    assert routed(controller, KILLED + 8.2 + REPLICA_TTL_S - 0.5) == ["iris-1"]


def test_a_replica_that_stays_silent_once_redis_answers_is_dropped_one_allowance_later(controller, replicas):
    routed(controller, KILLED - 0.2)
    outage(controller, replicas, until=KILLED + 8)
    assert routed(controller, KILLED + 8.2) == ["iris-1"]
    assert routed(controller, KILLED + 8.2 + REPLICA_TTL_S + 0.1) == []  # its host died with Redis


def test_without_an_outage_a_silent_replica_is_dropped_after_the_allowance(controller):
    assert routed(controller, KILLED) == ["iris-1"]
    assert routed(controller, KILLED - 0.5 + REPLICA_TTL_S + 0.1) == []


def test_the_allowance_grows_by_the_span_redis_could_not_be_read_and_only_for_one_ttl_after():
    silence = SilenceAllowance(ttl_s=5.0)
    silence.read(10.0)
    silence.failed(10.3)
    silence.failed(10.6)
    assert silence.ttl_at(13.0) == 5.0 + 3.0  # unread since 10.0
    silence.read(13.0)
    assert silence.ttl_at(17.9) == 8.0
    assert silence.ttl_at(18.0) == 5.0


@pytest.mark.parametrize("length", [97, 98, 99, 120])
def test_a_state_folder_too_deep_for_haproxys_socket_path_gets_a_short_socket_folder(length: int) -> None:
    """haproxy refuses a master socket path over 97 bytes ("too long (max 97)") and would not start."""
    base = "/tmp/sluice-state-"
    deep = Path(base + "d" * (length - len(base) - len("/master.sock")))  # never created: only named
    assert len(str(deep / "master.sock")) == length
    proxy = HAProxy(deep, executable="haproxy")
    try:
        assert len(str(proxy.socket_path)) <= 97
        assert (proxy.socket_path.parent == deep) is (length <= 97)
    finally:
        proxy.close()
