"""The proxies' routing records' contract (`foundation.proxy_registry.ProxyRegistry`), and what a
launcher and a test judge from them.

Fixtures a subclass provides: `proxies` (empty).
"""

from __future__ import annotations

from foundation.proxy_registry import PROXY_TTL_S, ProxyRecord, ProxyRegistry, routed_everywhere, unrouted

NOW = 1_700_000_000.0


def record(proxy_id: str, routes: list[str], settled: bool = True, seen: float = NOW) -> ProxyRecord:
    return ProxyRecord(proxy_id, routes, settled, seen, config="tag-1", listen="0.0.0.0:8888", pid=4242)


class ProxyRegistryContract:
    def test_no_proxy_published_yet(self, proxies: ProxyRegistry) -> None:
        assert proxies.live(NOW) == []

    def test_a_proxys_latest_record_reads_back_whole(self, proxies: ProxyRegistry) -> None:
        proxies.publish(record("edge-1", ["r-1"], settled=False, seen=NOW - 1))
        proxies.publish(record("edge-1", ["r-1", "r-2"]))

        assert proxies.live(NOW) == [record("edge-1", ["r-1", "r-2"])]

    def test_only_proxies_heard_from_within_the_ttl_are_live(self, proxies: ProxyRegistry) -> None:
        proxies.publish(record("silent", ["r-1"], seen=NOW - PROXY_TTL_S - 1))
        proxies.publish(record("here", ["r-2"], seen=NOW - 1))

        assert [p.proxy_id for p in proxies.live(NOW)] == ["here"]

    def test_long_silent_proxies_are_forgotten_and_a_stopped_one_withdraws(self, proxies: ProxyRegistry) -> None:
        proxies.publish(record("gone", ["r-1"], seen=NOW - 7200))
        proxies.publish(record("here", ["r-2"], seen=NOW - 10))
        proxies.publish(record("stopped", ["r-3"], seen=NOW - 10))

        proxies.forget_silent(NOW, after_s=3600)
        proxies.withdraw("stopped")
        proxies.withdraw("never-ran")

        assert [p.proxy_id for p in proxies.live(NOW, ttl_s=3600)] == ["here"]

    def test_a_replica_is_unrouted_once_every_live_proxy_settled_without_it(self, proxies: ProxyRegistry) -> None:
        assert unrouted(proxies.live(NOW), "r-1")  # no proxy: nothing routes it
        proxies.publish(record("edge-1", ["r-2"]))
        proxies.publish(record("edge-2", ["r-1", "r-2"], settled=False))
        assert not unrouted(proxies.live(NOW), "r-1")
        assert routed_everywhere(proxies.live(NOW), set()) is False  # edge-2 has not settled

        proxies.publish(record("edge-2", ["r-2"]))
        assert unrouted(proxies.live(NOW), "r-1") and not unrouted(proxies.live(NOW), "r-2")
        assert routed_everywhere(proxies.live(NOW), {"r-2"})
        assert not routed_everywhere([], {"r-2"})
