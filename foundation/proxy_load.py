"""The realtime requests in flight at the proxies, as each proxy publishes them and beat reads them.

Cortex scales a RealtimeAPI on its requests in flight (running at its replicas plus queued in
front of them), averaged over its `window`, which may be 10 s or hours. Only a proxy sees them
all, and there may be several proxies, so each proxy samples its own figure several times a
second and publishes running totals: per API, the sum of its samples and how many samples it
took, since the proxy started (`boot`). Beat differences two readings of a proxy: the change in
the sum over the change in the count is that proxy's mean in-flight figure between the readings,
however many readings beat missed. An API's figure is the sum of those means over the live
proxies; a proxy not heard from for `LOAD_TTL_S` stops counting, and a restarted one (a new
`boot`) starts from a fresh baseline. Publishing totals, not samples, keeps it to one Redis write
a second per proxy and nothing to trim.

`ProxyLoadBook` is what callers type against; `RedisProxyLoadBook` keeps one record per proxy in
one Redis hash (`keys.PROXY_LOAD`), `foundation.memory.MemoryProxyLoadBook` in a dict for fast tests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import redis

from foundation import keys

# A proxy whose totals are older than this is gone (or cut off): its figures stop counting. The
# same span after which launchers stop waiting for a silent proxy (sluice/proxy.py PROXY_TTL_S).
LOAD_TTL_S = 5.0
# How often a proxy publishes its totals (it samples more often; see sluice/proxy.py).
PUBLISH_EVERY_S = 1.0


class Totals(NamedTuple):
    """One API's samples at one proxy since its boot: their sum and their number."""

    in_flight_sum: float
    samples: int


@dataclass(frozen=True)
class ProxyLoad:
    """One proxy's running totals per API, as published at `seen` (epoch seconds)."""

    proxy_id: str
    boot: str                     # new each time the proxy starts: its totals restarted from zero
    seen: float
    totals: dict[str, Totals] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"proxy_id": self.proxy_id, "boot": self.boot, "seen": self.seen,
                "totals": {api: list(t) for api, t in self.totals.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProxyLoad:
        totals = {str(api): Totals(float(t[0]), int(t[1])) for api, t in dict(d["totals"]).items()}
        return cls(str(d["proxy_id"]), str(d["boot"]), float(d["seen"]), totals)


class LoadTally:
    """A proxy's side: adds each sample to the running totals of its APIs."""

    def __init__(self, boot: str | None = None) -> None:
        self.boot = boot or uuid.uuid4().hex
        self._totals: dict[str, Totals] = {}

    def add(self, in_flight: Mapping[str, int]) -> None:
        """One sample: each API's requests in flight at this proxy now (an API it routes with
        nothing in flight is a sample of 0, not a missing one)."""
        for api, n in in_flight.items():
            total = self._totals.get(api, Totals(0.0, 0))
            self._totals[api] = Totals(total.in_flight_sum + n, total.samples + 1)

    def record(self, proxy_id: str, now: float) -> ProxyLoad:
        """The totals as they stand, to publish."""
        return ProxyLoad(proxy_id, self.boot, now, dict(self._totals))


class InFlightMeter:
    """Beat's side: each API's mean in-flight figure, summed over live proxies, since the last reading.

    It keeps the previous reading of every proxy. A proxy seen for the first time (or restarted)
    only sets its baseline; one that published nothing new since the last reading (it samples and
    publishes on its own clock) counts with its previous means, so a reading that falls between
    two of its publications does not see it at zero (and before its first mean, not at all). An
    API whose totals did not move at a proxy that did publish is one it no longer samples: it adds
    nothing there.
    """

    def __init__(self, ttl_s: float = LOAD_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._previous: dict[str, ProxyLoad] = {}
        self._means: dict[tuple[str, str], float] = {}
        self._measured: set[str] = set()  # proxies with a mean since their baseline

    def read(self, loads: Iterable[ProxyLoad], now: float) -> dict[str, float] | None:
        """API -> its in-flight requests over all live proxies; None when no live proxy was read
        before (nothing can be said yet: the first reading after beat starts, or every proxy gone)."""
        live = [load for load in loads if now - load.seen <= self._ttl_s]
        figures: dict[str, float] = {}
        measured = False
        for load in live:
            before = self._previous.get(load.proxy_id)
            if before is None or before.boot != load.boot:
                self._means = {k: v for k, v in self._means.items() if k[0] != load.proxy_id}
                self._measured.discard(load.proxy_id)
                continue
            if load.seen == before.seen:  # nothing new published: it counts as it did, if it did yet
                if load.proxy_id in self._measured:
                    measured = True
                    for (proxy_id, api), mean in self._means.items():
                        if proxy_id == load.proxy_id:
                            figures[api] = figures.get(api, 0.0) + mean
                continue
            measured = True
            self._measured.add(load.proxy_id)
            means = {}
            for api, totals in load.totals.items():
                earlier = before.totals.get(api, Totals(0.0, 0))
                count = totals.samples - earlier.samples
                if count > 0:  # an API it no longer samples (no longer routes) adds nothing
                    means[api] = (totals.in_flight_sum - earlier.in_flight_sum) / count
                    figures[api] = figures.get(api, 0.0) + means[api]
            self._means = {k: v for k, v in self._means.items() if k[0] != load.proxy_id}
            self._means.update({(load.proxy_id, api): mean for api, mean in means.items()})
        live_ids = {load.proxy_id for load in live}
        self._previous = {load.proxy_id: load for load in live}
        self._means = {k: v for k, v in self._means.items() if k[0] in live_ids}
        self._measured &= live_ids
        return figures if measured else None


class ProxyLoadBook(Protocol):
    """Where proxies publish their in-flight totals."""

    def publish(self, load: ProxyLoad) -> None:
        """Replace the proxy's record."""

    def all(self) -> list[ProxyLoad]:
        """Every proxy's latest record, live or not (the reader judges by `seen`)."""

    def withdraw(self, proxy_id: str) -> None:
        """The proxy stopped."""

    def forget_silent(self, now: float, after_s: float) -> None:
        """Drop the records of proxies silent for `after_s` (they died without withdrawing)."""


class RedisProxyLoadBook:
    """`ProxyLoadBook` in one Redis hash (`keys.PROXY_LOAD`: proxy id -> JSON)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def publish(self, load: ProxyLoad) -> None:
        self._redis.hset(keys.PROXY_LOAD, load.proxy_id, json.dumps(load.to_dict()))

    def all(self) -> list[ProxyLoad]:
        return [load for _, load in self._records()]

    def withdraw(self, proxy_id: str) -> None:
        self._redis.hdel(keys.PROXY_LOAD, proxy_id)

    def forget_silent(self, now: float, after_s: float) -> None:
        for key, load in self._records(keep_unreadable=True):
            if load is None or now - load.seen > after_s:
                self._redis.hdel(keys.PROXY_LOAD, key)

    def _records(self, keep_unreadable: bool = False) -> list[tuple[Any, Any]]:
        found: list[tuple[Any, Any]] = []
        for key, raw in self._redis.hgetall(keys.PROXY_LOAD).items():
            try:
                found.append((key, ProxyLoad.from_dict(json.loads(raw))))
            except (ValueError, TypeError, KeyError, IndexError):  # a record this version cannot read
                if keep_unreadable:
                    found.append((key, None))
        return found
