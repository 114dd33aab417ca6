"""The replica directory's contract (`foundation.replica_directory.ReplicaDirectory`).

Fixtures a subclass provides: `directory` (empty) and `unreachable_directory` (one that cannot be
reached).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import redis

from foundation.replica_directory import REPLICA_TTL_S, ReplicaDirectory, ReplicaRecord

NOW = 1_700_000_000.0


def record(replica_id: str = "iris-1", **changes: Any) -> ReplicaRecord:
    base = ReplicaRecord(replica_id=replica_id, api="iris", bundle="ab" * 32, host="10.0.0.5", port=9000,
                         processes=2, ready=True, draining=False, seen=NOW, pid=4242, message="",
                         socket="/tmp/iris.sock", host_id="host-a")
    return replace(base, **changes)


class ReplicaDirectoryContract:
    def test_an_announced_replica_reads_back_whole(self, directory: ReplicaDirectory) -> None:
        announced = record(message="building", ready=False)

        directory.announce(announced)

        assert directory.all() == [announced]

    def test_each_heartbeat_rewrites_the_record(self, directory: ReplicaDirectory) -> None:
        directory.announce(record(ready=False))

        directory.announce(record(ready=True, seen=NOW + 1))

        assert directory.all() == [record(ready=True, seen=NOW + 1)]

    def test_records_are_listed_by_replica_id(self, directory: ReplicaDirectory) -> None:
        for replica_id in ("mnist-2", "iris-1", "iris-3"):
            directory.announce(record(replica_id))

        assert [r.replica_id for r in directory.all()] == ["iris-1", "iris-3", "mnist-2"]

    def test_a_removed_replica_is_gone_and_removing_one_never_there_is_harmless(
        self, directory: ReplicaDirectory,
    ) -> None:
        directory.announce(record("iris-1"))
        directory.announce(record("iris-2"))

        directory.remove("iris-1")
        directory.remove("never-there")

        assert [r.replica_id for r in directory.all()] == ["iris-2"]

    def test_live_replicas_are_those_heard_from_within_the_ttl_ready_or_not(
        self, directory: ReplicaDirectory,
    ) -> None:
        directory.announce(record("fresh", ready=False))
        directory.announce(record("silent", seen=NOW - REPLICA_TTL_S - 1))
        directory.announce(record("other-api", api="mnist"))

        assert [r.replica_id for r in directory.live(NOW)] == ["fresh", "other-api"]
        assert [r.replica_id for r in directory.live(NOW, "iris")] == ["fresh"]
        assert [r.replica_id for r in directory.live(NOW, "iris", ttl_s=60)] == ["fresh", "silent"]

    def test_only_live_ready_replicas_that_are_not_draining_are_routable(self, directory: ReplicaDirectory) -> None:
        directory.announce(record("serving"))
        directory.announce(record("building", ready=False))
        directory.announce(record("draining", draining=True))
        directory.announce(record("silent", seen=NOW - REPLICA_TTL_S - 1))
        directory.announce(record("other-api", api="mnist"))

        assert [r.replica_id for r in directory.routable(NOW)] == ["other-api", "serving"]
        assert [r.replica_id for r in directory.routable(NOW, "iris")] == ["serving"]

    def test_replicas_silent_for_long_are_forgotten(self, directory: ReplicaDirectory) -> None:
        directory.announce(record("gone", seen=NOW - 3600))
        directory.announce(record("recent", seen=NOW - 10))

        assert directory.forget_silent(NOW, older_than_s=300) == 1
        assert [r.replica_id for r in directory.all()] == ["recent"]
        assert directory.forget_silent(NOW, older_than_s=300) == 0

    def test_a_directory_that_cannot_be_reached_raises_a_connection_error(
        self, unreachable_directory: ReplicaDirectory,
    ) -> None:
        for call in (lambda: unreachable_directory.announce(record()), lambda: unreachable_directory.remove("iris-1"),
                     unreachable_directory.all, lambda: unreachable_directory.live(NOW),
                     lambda: unreachable_directory.routable(NOW), lambda: unreachable_directory.forget_silent(NOW)):
            with pytest.raises(redis.ConnectionError):
                call()
