"""The foundation's in-memory fakes keep their Redis twins' contracts (`tests/contracts/`), and what
only a fake has: the `unreachable` switch, a clock for expiry, waiting for lines without sleeping.

The same contracts run against Redis in tests/integration/test_foundation_redis.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

from foundation.log_streams import LogStreams, job_stream
from foundation.memory import (
    MemoryApiRegistry,
    MemoryFigureStore,
    MemoryHostDirectory,
    MemoryLogStreams,
    MemoryProxyLoadBook,
    MemoryProxyRegistry,
    MemoryReplicaAssignments,
    MemoryReplicaDirectory,
    MemoryScaleBook,
)
from tests.contracts.api_registry import ApiRegistryContract, config
from tests.contracts.figure_store import FigureStoreContract
from tests.contracts.hosts import HostDirectoryContract
from tests.contracts.log_streams import LogStreamsContract, lines
from tests.contracts.proxy_load import ProxyLoadBookContract
from tests.contracts.proxy_registry import ProxyRegistryContract
from tests.contracts.replica_assignments import ReplicaAssignmentsContract
from tests.contracts.replica_directory import ReplicaDirectoryContract, record
from tests.contracts.replica_scale import ScaleBookContract


class TestTheMemoryApiRegistry(ApiRegistryContract):
    @pytest.fixture
    def registry(self) -> MemoryApiRegistry:
        return MemoryApiRegistry()

    @pytest.fixture
    def unreachable_registry(self) -> MemoryApiRegistry:
        registry = MemoryApiRegistry()
        registry.unreachable = True
        return registry


class TestTheMemoryReplicaDirectory(ReplicaDirectoryContract):
    @pytest.fixture
    def directory(self) -> MemoryReplicaDirectory:
        return MemoryReplicaDirectory()

    @pytest.fixture
    def unreachable_directory(self) -> MemoryReplicaDirectory:
        directory = MemoryReplicaDirectory()
        directory.unreachable = True
        return directory


class TestTheMemoryLogStreams(LogStreamsContract):
    @pytest.fixture
    def make_streams(self) -> Callable[..., LogStreams]:
        return MemoryLogStreams

    @pytest.fixture
    def unreachable_streams(self) -> MemoryLogStreams:
        streams = MemoryLogStreams()
        streams.unreachable = True
        return streams


class TestTheMemoryFigureStore(FigureStoreContract):
    @pytest.fixture
    def store(self) -> MemoryFigureStore:
        return MemoryFigureStore()

    @pytest.fixture
    def unreachable_store(self) -> MemoryFigureStore:
        store = MemoryFigureStore()
        store.unreachable = True
        return store


# -- what only the fakes have ------------------------------------------------------------------------
class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_fake_made_unreachable_answers_again_once_reachable() -> None:
    registry = MemoryApiRegistry()
    registry.put(config(), "b")
    registry.unreachable = True
    with pytest.raises(redis.ConnectionError, match="unreachable"):
        registry.get("iris")

    registry.unreachable = False

    assert registry.get("iris").bundle == "b"


def test_a_directory_record_read_back_is_a_copy_of_what_was_announced() -> None:
    directory = MemoryReplicaDirectory()
    announced = record()
    directory.announce(announced)

    assert directory.all() == [announced] and directory.all()[0] is not announced


def test_a_memory_stream_is_gone_its_retention_after_its_last_line() -> None:
    clock = Clock()
    streams = MemoryLogStreams(max_lines=100, retention_s=120, clock=clock)
    stream = job_stream("j1")
    streams.append({stream: lines(1)})
    clock.now += 100
    streams.append({stream: lines(2)})  # each line keeps the stream another `retention_s`

    clock.now += 119
    assert [line["n"] for line in streams.read(stream).lines] == [1, 2]
    clock.now += 1
    assert streams.read(stream).lines == []


def test_stream_ids_grow_within_one_millisecond_and_after_the_clock_moves() -> None:
    clock = Clock(1.0)
    streams = MemoryLogStreams(clock=clock)
    stream = job_stream("j1")
    streams.append({stream: lines(1, 2)})
    first = streams.read(stream, limit=1).next
    last = streams.read(stream).next
    clock.now = 2.0
    streams.append({stream: lines(3)})

    assert (first, last, streams.read(stream).next) == ("1000-0", "1000-1", "2000-0")
    assert streams.read(stream, after="1000").lines == [{"message": "line 2", "n": 2}, {"message": "line 3", "n": 3}]


def test_waiting_for_lines_returns_once_another_thread_appended_them() -> None:
    streams = MemoryLogStreams()
    stream = job_stream("j1")
    writer = threading.Thread(target=lambda: streams.append({stream: lines(1, 2)}))

    writer.start()
    got = streams.wait_for_lines(stream, 2, timeout_s=30)
    writer.join()

    assert [line["n"] for line in got] == [1, 2]
    assert streams.appends == 1


def test_waiting_for_lines_that_never_come_gives_what_the_stream_holds_after_the_timeout() -> None:
    streams = MemoryLogStreams()

    assert streams.wait_for_lines(job_stream("quiet"), 1, timeout_s=0.01) == []


class TestTheMemoryReplicaAssignments(ReplicaAssignmentsContract):
    @pytest.fixture
    def assignments(self) -> MemoryReplicaAssignments:
        return MemoryReplicaAssignments()


class TestTheMemoryScaleBook(ScaleBookContract):
    @pytest.fixture
    def book(self) -> MemoryScaleBook:
        return MemoryScaleBook()


class TestTheMemoryProxyLoadBook(ProxyLoadBookContract):
    @pytest.fixture
    def loads(self) -> MemoryProxyLoadBook:
        return MemoryProxyLoadBook()


class TestTheMemoryHostDirectory(HostDirectoryContract):
    @pytest.fixture
    def hosts(self) -> MemoryHostDirectory:
        return MemoryHostDirectory()


class TestTheMemoryProxyRegistry(ProxyRegistryContract):
    @pytest.fixture
    def proxies(self) -> MemoryProxyRegistry:
        return MemoryProxyRegistry()
