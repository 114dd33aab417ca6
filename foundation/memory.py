"""In-memory fakes of the foundation's Redis collaborators, for fast tests of every layer.

Each fake keeps the contract of its Redis implementation, checked by the same contract tests
(`tests/contracts/`, run against the fakes in tests/unit and against Redis in tests/integration):

- `MemoryApiRegistry`: `foundation.api_registry.ApiRegistry`
- `MemoryReplicaDirectory`: `foundation.replica_directory.ReplicaDirectory`
- `MemoryLogStreams`: `foundation.log_streams.LogStreams`
- `MemoryFigureStore`: `foundation.figure_store.FigureStore` (hand it to a real `Recorder`)
- `MemoryProxyLoadBook`: `foundation.proxy_load.ProxyLoadBook`

What they leave out is what only Redis has: other processes and hosts. Each keeps what it stores
in the stored form (JSON text where Redis holds JSON), so a value reads back as a copy, as it would
from Redis. Each takes one lock per call, so a flusher thread and a test may share one. Setting
`unreachable` makes every call fail as a Redis that cannot be reached does (`redis.ConnectionError`),
for tests of what callers do then.

Production code never imports this module; tests of any layer may.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from foundation.acknowledgements import Acknowledgements, refusal
from foundation.api_registry import (
    ApiDefinition,
    ApiRegistry,
    DeployedApi,
    not_deployed,
)
from foundation.figure_store import FigureStore, Increment
from foundation.hosts import HOST_TTL_S, HostDirectory, HostRecord
from foundation.idempotency import IdempotencyKeys
from foundation.log_streams import (
    DEFAULT_MAX_LINES,
    DEFAULT_PAGE_LINES,
    DEFAULT_RETENTION_S,
    MAX_PAGE_LINES,
    START,
    LogPage,
    LogStreams,
    clamp_limit,
    parse_line,
    parse_stream_id,
    stream_id_key,
)
from foundation.predictor_builds import PredictorBuilds
from foundation.proxy_load import ProxyLoad, ProxyLoadBook
from foundation.proxy_registry import FORGET_PROXIES_AFTER_S, PROXY_TTL_S, ProxyRecord, ProxyRegistry
from foundation.replica_directory import (
    REPLICA_TTL_S,
    ReplicaDirectory,
    ReplicaRecord,
    live_among,
    routable_among,
)
from foundation.replica_placement import PlacedReplicas, ReplicaAssignments
from foundation.replica_scale import ReplicaScale, ScaleBook

__all__ = ["MemoryApiRegistry", "MemoryFigureStore", "MemoryLogStreams", "MemoryReplicaDirectory"]

Clock = Callable[[], float]


class _Fake:
    """What every fake shares: one lock, and the switch that makes it unreachable."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.unreachable = False

    def _reach(self) -> None:
        if self.unreachable:
            raise redis.ConnectionError(f"{type(self).__name__} is unreachable (set by the test)")


class MemoryApiRegistry(_Fake, ApiRegistry):
    """The deployed APIs in a dict: name -> the deployment's JSON."""

    def __init__(self) -> None:
        super().__init__()
        self._apis: dict[str, str] = {}
        self._generation = 0

    def put(self, api: ApiDefinition, bundle: str, now: float | None = None,
            environment: dict[str, Any] | None = None) -> DeployedApi:
        deployed = DeployedApi.of(api, bundle, now, environment)
        with self.lock:
            self._reach()
            self._apis[api.name] = deployed.to_json()
            self._generation += 1
        return deployed

    def get(self, name: str) -> DeployedApi:
        with self.lock:
            self._reach()
            raw = self._apis.get(name)
            deployed = list(self._apis)
        if raw is None:
            raise not_deployed(name, deployed)
        return DeployedApi.from_json(raw)

    def all(self) -> list[DeployedApi]:
        with self.lock:
            self._reach()
            raws = list(self._apis.values())
        return sorted((DeployedApi.from_json(raw) for raw in raws), key=lambda a: a.name)

    def delete(self, name: str) -> None:
        with self.lock:
            self._reach()
            self._generation += 1
            if self._apis.pop(name, None) is None:
                raise not_deployed(name)

    def generation(self) -> int:
        with self.lock:
            self._reach()
            return self._generation


class MemoryReplicaDirectory(_Fake, ReplicaDirectory):
    """Replica records in a dict: replica id -> the record's dict (a copy of what was announced)."""

    def __init__(self) -> None:
        super().__init__()
        self._records: dict[str, dict[str, Any]] = {}

    def announce(self, record: ReplicaRecord) -> None:
        with self.lock:
            self._reach()
            self._records[record.replica_id] = record.to_dict()

    def remove(self, replica_id: str) -> None:
        with self.lock:
            self._reach()
            self._records.pop(replica_id, None)

    def all(self) -> list[ReplicaRecord]:
        with self.lock:
            self._reach()
            stored = list(self._records.values())
        return sorted((ReplicaRecord.from_dict(d) for d in stored), key=lambda r: r.replica_id)

    def live(self, now: float, api: str | None = None, ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
        return live_among(self.all(), now, api, ttl_s)

    def routable(self, now: float, api: str | None = None, ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
        return routable_among(self.all(), now, api, ttl_s)

    def forget_silent(self, now: float, older_than_s: float = 60 * REPLICA_TTL_S) -> int:
        with self.lock:
            gone = [r.replica_id for r in self.all() if now - r.seen > older_than_s]
            for replica_id in gone:
                del self._records[replica_id]
        return len(gone)


class MemoryHostDirectory(_Fake, HostDirectory):
    """Host records in a dict: host id -> a copy of what was announced."""

    def __init__(self) -> None:
        super().__init__()
        self._records: dict[str, dict[str, Any]] = {}

    def announce(self, record: HostRecord) -> None:
        with self.lock:
            self._reach()
            self._records[record.host_id] = record.to_dict()

    def remove(self, host_id: str) -> None:
        with self.lock:
            self._reach()
            self._records.pop(host_id, None)

    def all(self) -> list[HostRecord]:
        with self.lock:
            self._reach()
            stored = list(self._records.values())
        return sorted((HostRecord.from_dict(d) for d in stored), key=lambda r: r.host_id)

    def live(self, now: float, ttl_s: float = HOST_TTL_S) -> list[HostRecord]:
        return [r for r in self.all() if r.live(now, ttl_s)]


class MemoryScaleBook(_Fake, ScaleBook):
    """Each RealtimeAPI's decided replica count in a dict."""

    def __init__(self) -> None:
        super().__init__()
        self._scales: dict[str, ReplicaScale] = {}

    def get(self, api_name: str) -> ReplicaScale | None:
        with self.lock:
            self._reach()
            return self._scales.get(api_name)

    def all(self) -> dict[str, ReplicaScale]:
        with self.lock:
            self._reach()
            return dict(self._scales)

    def set(self, api_name: str, scale: ReplicaScale) -> None:
        with self.lock:
            self._reach()
            self._scales[api_name] = scale

    def forget(self, api_name: str) -> None:
        with self.lock:
            self._reach()
            self._scales.pop(api_name, None)


class MemoryProxyLoadBook(_Fake, ProxyLoadBook):
    """Each proxy's in-flight totals in a dict, stored as JSON text as Redis holds them."""

    def __init__(self) -> None:
        super().__init__()
        self._loads: dict[str, str] = {}

    def publish(self, load: ProxyLoad) -> None:
        with self.lock:
            self._reach()
            self._loads[load.proxy_id] = json.dumps(load.to_dict())

    def all(self) -> list[ProxyLoad]:
        with self.lock:
            self._reach()
            return [ProxyLoad.from_dict(json.loads(raw)) for raw in self._loads.values()]

    def withdraw(self, proxy_id: str) -> None:
        with self.lock:
            self._reach()
            self._loads.pop(proxy_id, None)

    def forget_silent(self, now: float, after_s: float) -> None:
        with self.lock:
            self._reach()
            self._loads = {k: raw for k, raw in self._loads.items()
                           if now - float(json.loads(raw)["seen"]) <= after_s}


class MemoryProxyRegistry(_Fake, ProxyRegistry):
    """Each proxy's routing state in a dict, stored as JSON text as Redis holds it."""

    def __init__(self) -> None:
        super().__init__()
        self._records: dict[str, str] = {}

    def publish(self, record: ProxyRecord) -> None:
        with self.lock:
            self._reach()
            self._records[record.proxy_id] = json.dumps(record.to_dict())

    def live(self, now: float, ttl_s: float = PROXY_TTL_S) -> list[ProxyRecord]:
        with self.lock:
            self._reach()
            records = [ProxyRecord.from_dict(json.loads(raw)) for raw in self._records.values()]
        return [record for record in records if now - record.seen <= ttl_s]

    def forget_silent(self, now: float, after_s: float = FORGET_PROXIES_AFTER_S) -> None:
        with self.lock:
            self._reach()
            self._records = {k: raw for k, raw in self._records.items()
                             if now - float(json.loads(raw)["seen"]) <= after_s}

    def withdraw(self, proxy_id: str) -> None:
        with self.lock:
            self._reach()
            self._records.pop(proxy_id, None)


class MemoryReplicaAssignments(_Fake, ReplicaAssignments):
    """Each RealtimeAPI's placement in a dict, stored in its JSON form."""

    def __init__(self) -> None:
        super().__init__()
        self._placed: dict[str, dict[str, Any]] = {}

    def all(self) -> dict[str, PlacedReplicas]:
        with self.lock:
            self._reach()
            return {name: PlacedReplicas.from_dict(d) for name, d in self._placed.items()}

    def set(self, api_name: str, placed: PlacedReplicas) -> None:
        with self.lock:
            self._reach()
            self._placed[api_name] = placed.to_dict()

    def forget(self, api_name: str) -> None:
        with self.lock:
            self._reach()
            self._placed.pop(api_name, None)


@dataclass
class _Stream:
    lines: deque[tuple[str, str]]  # (id, line), oldest first
    last_id: tuple[int, int] = (0, 0)
    expires_at: float = float("inf")


class MemoryLogStreams(_Fake, LogStreams):
    """Log streams in memory, with ids as Redis gives them (`<milliseconds>-<sequence>`, growing).

    A stream keeps exactly its newest `max_lines` (Redis keeps about as many, never fewer) and is
    gone `retention_s` after its last line, by `clock` (seconds; `time.time` by default).
    `appends` counts the calls that sent lines; `wait_for_lines` waits (on a condition, never by
    sleeping) until a stream holds some.
    """

    def __init__(
        self, max_lines: int = DEFAULT_MAX_LINES, retention_s: float = DEFAULT_RETENTION_S,
        clock: Clock = time.time,
    ) -> None:
        super().__init__()
        self._max_lines = max(int(max_lines), 1)
        self.retention_s = max(int(retention_s), 1)
        self._clock = clock
        self._streams: dict[str, _Stream] = {}
        self._changed = threading.Condition(self.lock)
        self.appends = 0

    @property
    def max_lines(self) -> int:
        return self._max_lines

    def _stream(self, name: str, now: float) -> _Stream | None:
        stream = self._streams.get(name)
        if stream is not None and now >= stream.expires_at:
            del self._streams[name]
            return None
        return stream

    def _next_id(self, stream: _Stream, now: float) -> str:
        milliseconds = int(now * 1000)
        last_ms, last_seq = stream.last_id
        stream.last_id = (milliseconds, 0) if milliseconds > last_ms else (last_ms, last_seq + 1)
        return f"{stream.last_id[0]}-{stream.last_id[1]}"

    def append(self, lines_by_stream: Mapping[str, Iterable[str]], superseded: Collection[str] = ()) -> int:
        batches = {name: list(lines) for name, lines in lines_by_stream.items()}
        sent = sum(len(lines) for lines in batches.values())
        with self._changed:
            self._reach()
            if not sent:
                return 0
            now = self._clock()
            for name, lines in batches.items():
                stream = self._stream(name, now)
                if stream is not None and name in superseded:
                    stream.lines.clear()
                if not lines:
                    continue
                if stream is None:
                    stream = self._streams[name] = _Stream(deque(maxlen=self._max_lines))
                for line in lines:
                    stream.lines.append((self._next_id(stream, now), line))
                stream.expires_at = now + self.retention_s
            self.appends += 1
            self._changed.notify_all()
        return sent

    def read(self, stream: str, after: str | None = None, limit: int = DEFAULT_PAGE_LINES) -> LogPage:
        cursor = parse_stream_id(after) if after else START
        position = stream_id_key(cursor)
        with self.lock:
            self._reach()
            found = self._stream(stream, self._clock())
            entries = [(i, line) for i, line in found.lines if stream_id_key(i) > position] if found else []
        entries = entries[:clamp_limit(limit)]
        if not entries:
            return LogPage([], cursor)
        return LogPage([parse_line(line) for _, line in entries], entries[-1][0])

    def wait_for_lines(self, stream: str, count: int, timeout_s: float) -> list[dict[str, Any]]:
        """The stream's lines once it holds at least `count` (or whatever it holds after `timeout_s`)."""

        def held() -> int:
            found = self._stream(stream, self._clock())
            return len(found.lines) if found else 0

        with self._changed:
            self._changed.wait_for(lambda: held() >= count, timeout=timeout_s)
        return self.read(stream, limit=MAX_PAGE_LINES).lines


class MemoryFigureStore(_Fake, FigureStore):
    """Figure sums in a dict per key, as Redis's hashes hold them."""

    def __init__(self) -> None:
        super().__init__()
        self._hashes: dict[str, dict[str, float]] = {}

    def add(self, increments: Sequence[Increment]) -> None:
        with self.lock:
            self._reach()
            for increment in increments:
                fields = self._hashes.setdefault(increment.key, {})
                fields[increment.field] = fields.get(increment.field, 0) + increment.amount

    def read(self, keys: Sequence[str]) -> list[dict[str, float]]:
        with self.lock:
            self._reach()
            return [{name: float(value) for name, value in self._hashes.get(key, {}).items()} for key in keys]


class MemoryPredictorBuilds(PredictorBuilds):
    """`foundation.predictor_builds.PredictorBuilds` in a dict."""

    def __init__(self) -> None:
        self._failures: dict[str, dict[str, Any]] = {}

    def failed(self, api_name: str, bundle: str, message: str) -> None:
        self._failures[api_name] = {"bundle": bundle, "message": message, "at": time.time()}

    def succeeded(self, api_name: str) -> None:
        self._failures.pop(api_name, None)

    def failure(self, api_name: str) -> dict[str, Any] | None:
        found = self._failures.get(api_name)
        return dict(found) if found is not None else None

    def forget(self, api_name: str) -> None:
        self.succeeded(api_name)


class MemoryAcknowledgements(Acknowledgements):
    """`foundation.acknowledgements.Acknowledgements` without Redis: counts the writes confirmed, and
    refuses them while `confirmed_by` is below `replicas` (a test's cut-off replica)."""

    def __init__(self, replicas: int = 0, confirmed_by: int = 0) -> None:
        self.replicas, self.confirmed_by = replicas, confirmed_by
        self.confirmed = 0

    def confirm(self, retry_by: str | None = None) -> None:
        if self.confirmed_by < self.replicas:
            raise refusal(self.confirmed_by, self.replicas, 1000, retry_by)
        self.confirmed += 1


class MemoryIdempotencyKeys(_Fake, IdempotencyKeys):
    """`foundation.idempotency.IdempotencyKeys` in a dict (claims do not expire here)."""

    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[tuple[str, str], str] = {}

    def claim(self, scope: str, key: str, candidate: str, stale: str = "") -> str:
        with self.lock:
            self._reach()
            held = self.claims.get((scope, key))
            if held is None or held == stale:
                self.claims[(scope, key)] = held = candidate
            return held

    def release(self, scope: str, key: str, candidate: str) -> None:
        with self.lock:
            if self.claims.get((scope, key)) == candidate:
                del self.claims[(scope, key)]
