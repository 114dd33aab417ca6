"""What each proxy says it routes: the meeting point of the proxy controllers and the replica
launchers.

Each proxy controller (`sluice/proxy.py`) publishes a `ProxyRecord` every turn: the replicas its
latest haproxy configuration routes to, and whether haproxy has settled on it (reloaded, no older
worker left). A launcher draining an old replica waits until no live proxy routes it any more
(`unrouted`) before ending it, so no request is sent to a replica that is going away; a test waits
until every proxy routes a new one (`routed_everywhere`).

`ProxyRegistry` is what callers type against; `RedisProxyRegistry` keeps the records in one Redis
hash (`keys.PROXIES`), `foundation.memory.MemoryProxyRegistry` in a dict for fast tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import redis

from foundation import keys

# A proxy not heard from for this long is gone: it routes nothing any more.
PROXY_TTL_S = 5.0
# Records of proxies silent this long are dropped.
FORGET_PROXIES_AFTER_S = 3600.0


@dataclass(frozen=True)
class ProxyRecord:
    """One proxy's routing state, as launchers read it; `to_dict()` is the stored form."""

    proxy_id: str
    routes: list[str]     # replica ids its latest configuration routes to
    settled: bool         # haproxy serves exactly that configuration, no older worker is left
    seen: float           # last publication (epoch seconds)
    config: str = ""      # the configuration's tag
    listen: str = ""
    pid: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProxyRecord:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


class ProxyRegistry(Protocol):
    """Where every proxy's routing state is kept."""

    def publish(self, record: ProxyRecord) -> None:
        """Record a proxy's state (replacing its last one)."""

    def live(self, now: float, ttl_s: float = PROXY_TTL_S) -> list[ProxyRecord]:
        """The proxies heard from within `ttl_s` (an unreadable record is left out)."""

    def forget_silent(self, now: float, after_s: float = FORGET_PROXIES_AFTER_S) -> None:
        """Drop the records of proxies silent for longer than `after_s` (and unreadable ones)."""

    def withdraw(self, proxy_id: str) -> None:
        """A proxy that stops takes its record away: it routes nothing any more."""


def unrouted(proxies: Iterable[ProxyRecord], replica_id: str) -> bool:
    """True when no proxy can send the replica another request: each has settled on a
    configuration that does not route it (true as well when there is no proxy)."""
    return all(p.settled and replica_id not in p.routes for p in proxies)


def routed_everywhere(proxies: Iterable[ProxyRecord], replica_ids: set[str]) -> bool:
    """True when there is a proxy and every one has settled on a configuration routing all of
    `replica_ids` (no reload in progress, no older haproxy worker left)."""
    listed = list(proxies)
    return bool(listed) and all(p.settled and replica_ids <= set(p.routes) for p in listed)


class RedisProxyRegistry:
    """`ProxyRegistry` in one Redis hash (`keys.PROXIES`: proxy id -> JSON)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def publish(self, record: ProxyRecord) -> None:
        self._redis.hset(keys.PROXIES, record.proxy_id, json.dumps(record.to_dict()))

    def live(self, now: float, ttl_s: float = PROXY_TTL_S) -> list[ProxyRecord]:
        return [record for _, record in self._records() if record is not None and now - record.seen <= ttl_s]

    def withdraw(self, proxy_id: str) -> None:
        self._redis.hdel(keys.PROXIES, proxy_id)

    def forget_silent(self, now: float, after_s: float = FORGET_PROXIES_AFTER_S) -> None:
        for key, record in self._records():
            if record is None or now - record.seen > after_s:
                self._redis.hdel(keys.PROXIES, key)

    def _records(self) -> list[tuple[Any, ProxyRecord | None]]:
        found: list[tuple[Any, ProxyRecord | None]] = []
        for key, raw in self._redis.hgetall(keys.PROXIES).items():
            try:
                found.append((key, ProxyRecord.from_dict(json.loads(raw))))
            except (ValueError, TypeError, KeyError):  # a record this version cannot read
                found.append((key, None))
        return found
