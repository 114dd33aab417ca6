"""The proxies' in-flight totals book's contract (`foundation.proxy_load.ProxyLoadBook`).

Fixtures a subclass provides: `loads` (empty).
"""

from __future__ import annotations

from foundation.proxy_load import ProxyLoad, ProxyLoadBook, Totals

NOW = 1_700_000_000.0


def load(proxy_id: str, seen: float = NOW, **totals: tuple[float, int]) -> ProxyLoad:
    return ProxyLoad(proxy_id, f"boot-of-{proxy_id}", seen, {api: Totals(*t) for api, t in totals.items()})


class ProxyLoadBookContract:
    def test_no_proxy_published_yet(self, loads: ProxyLoadBook) -> None:
        assert loads.all() == []

    def test_each_proxys_latest_totals_read_back_whole(self, loads: ProxyLoadBook) -> None:
        loads.publish(load("edge-1", iris=(4.0, 3)))
        loads.publish(load("edge-1", NOW + 1, iris=(10.0, 6), mlp=(0.0, 3)))
        loads.publish(load("edge-2", iris=(1.0, 2)))

        assert sorted(loads.all(), key=lambda x: x.proxy_id) == [
            load("edge-1", NOW + 1, iris=(10.0, 6), mlp=(0.0, 3)), load("edge-2", iris=(1.0, 2))]

    def test_a_stopped_proxy_withdraws_and_a_silent_one_is_forgotten(self, loads: ProxyLoadBook) -> None:
        loads.publish(load("stopped"))
        loads.publish(load("silent", NOW - 100))
        loads.publish(load("alive", NOW - 1))

        loads.withdraw("stopped")
        loads.forget_silent(NOW, after_s=60)

        assert [x.proxy_id for x in loads.all()] == ["alive"]
