"""The host directory's contract (`foundation.hosts.HostDirectory`).

Fixtures a subclass provides: `hosts` (empty).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from foundation.hosts import HOST_TTL_S, HostDirectory, HostRecord, Resources

NOW = 1_700_000_000.0


def host(host_id: str = "host-a", **changes: Any) -> HostRecord:
    base = HostRecord(host_id=host_id, address="10.0.0.5", offers=Resources(4000, 8 * 2**30, 1),
                      hardware="gpu", roles=("replicas",), seen=NOW)
    return replace(base, **changes)


class HostDirectoryContract:
    def test_an_announced_host_reads_back_whole(self, hosts: HostDirectory) -> None:
        hosts.announce(host(roles=("replicas", "workers"), hardware=None))

        assert hosts.all() == [host(roles=("replicas", "workers"), hardware=None)]

    def test_each_heartbeat_rewrites_the_record(self, hosts: HostDirectory) -> None:
        hosts.announce(host())
        hosts.announce(host(seen=NOW + 2, offers=Resources(2000, 2**30, 0)))

        assert hosts.all() == [host(seen=NOW + 2, offers=Resources(2000, 2**30, 0))]

    def test_only_hosts_heard_from_recently_are_live(self, hosts: HostDirectory) -> None:
        hosts.announce(host("host-b", seen=NOW - HOST_TTL_S - 1))
        hosts.announce(host("host-a"))

        assert [h.host_id for h in hosts.live(NOW)] == ["host-a"]
        assert [h.host_id for h in hosts.all()] == ["host-a", "host-b"]

    def test_a_host_that_stops_is_removed(self, hosts: HostDirectory) -> None:
        hosts.announce(host("host-a"))
        hosts.announce(host("host-b"))

        hosts.remove("host-a")
        hosts.remove("never-seen")

        assert [h.host_id for h in hosts.all()] == ["host-b"]
