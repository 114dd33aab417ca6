"""Realtime replicas: how they announce themselves, and how one replica knows it is ready.

A replica is a gunicorn serving one realtime API, started by a launcher (`sluice serve`) on
any host. The launcher writes a `ReplicaRecord` into Redis every heartbeat; the proxy routes an
API's requests to its live, ready, non-draining replicas. Inside a replica each gunicorn process
builds the predictor on its own (after the fork, so CUDA and threads are its own) and leaves a
marker file when done: the replica is ready when every process has one.

`ReplicaDirectory` is what callers type against; `RedisReplicaDirectory` keeps the records in one
Redis hash shared by all hosts (`keys.REPLICAS`), `foundation.memory.MemoryReplicaDirectory` in a
dict for fast tests; both pass `tests/contracts/replica_directory.py`. The readiness markers are
files in a replica's own state folder, shared by the processes of one host only: a fast test
gives them a temporary folder, so they have no fake.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import redis

from foundation import keys

REPLICAS_KEY = keys.REPLICAS
# A replica silent for this many seconds is dropped from the proxy's routes.
REPLICA_TTL_S = 5.0


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica as the proxy sees it; `to_dict()` is the stored form."""

    replica_id: str
    api: str
    bundle: str          # the deployment it serves (a redeploy starts replicas of the new bundle)
    host: str            # the address the proxy reaches it at
    port: int
    processes: int       # gunicorn processes it runs
    ready: bool          # every process has built the predictor and loaded its models
    draining: bool       # being replaced or stopped: no new requests
    seen: float          # time of the last heartbeat (epoch seconds)
    pid: int = 0         # the launcher's process id, for operators
    message: str = ""    # why it is not ready (a step of its start, or a failure), if known
    # Its message is a failure (a predictor or environment that failed to build, a server that exited),
    # not a step of its start (building its environment, starting): what `sluice get` calls an error.
    failing: bool = False
    socket: str = ""     # a Unix socket it also listens on, for a proxy on its own host
    host_id: str = ""    # the host it runs on (sluice/local_socket.py), to tell whether `socket` is reachable
    # The placement host whose manager started it (`foundation/hosts.py`; "" for a launcher started
    # by hand): counts ready replicas per placement host exactly, even with two agents on one address.
    placement_host: str = ""
    # The last time a process of it was stopped for memory (foundation/memory_limits.py; 0: never), and what
    # its launcher said of it (the limit and the peak).
    last_oom_at: float = 0.0
    last_oom: str = ""
    # The GPUs its processes see (CUDA_VISIBLE_DEVICES, handed out by its host: foundation/devices.py).
    devices: str = ""
    # It serves TLS only, with its host's certificate (sluice/tls/hosts.py): the proxy routes it over TLS.
    tls: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def routable(self, now: float, ttl_s: float = REPLICA_TTL_S) -> bool:
        """Whether the proxy should send it new requests."""
        return self.ready and not self.draining and now - self.seen <= ttl_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaRecord:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def seen_at(self, now: float, **changes: Any) -> ReplicaRecord:
        return replace(self, seen=now, **changes)


def live_among(records: Iterable[ReplicaRecord], now: float, api: str | None = None,
               ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
    """Those of `records` heard from within `ttl_s` (ready or not), of one API or all."""
    return [r for r in records if now - r.seen <= ttl_s and (api is None or r.api == api)]


def routable_among(records: Iterable[ReplicaRecord], now: float, api: str | None = None,
                   ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
    """Those of `records` the proxy should send new requests to."""
    return [r for r in live_among(records, now, api, ttl_s) if r.routable(now, ttl_s)]


class ReplicaDirectory(Protocol):
    """The replicas of every realtime API, as their launchers announce them. A directory that
    cannot be reached raises `redis.RedisError` (a `redis.ConnectionError` when it cannot be
    reached at all)."""

    def announce(self, record: ReplicaRecord) -> None:
        """Write (or rewrite) the replica's record: every heartbeat of its launcher."""
        ...

    def remove(self, replica_id: str) -> None:
        """Forget the replica (nothing happens if it is not there)."""
        ...

    def all(self) -> list[ReplicaRecord]:
        """Every record, live or not, by replica id."""
        ...

    def live(self, now: float, api: str | None = None, ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
        """Replicas heard from within `ttl_s` (ready or not), of one API or all."""
        ...

    def routable(self, now: float, api: str | None = None, ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
        """Live replicas that are ready and not draining, of one API or all."""
        ...

    def forget_silent(self, now: float, older_than_s: float = 60 * REPLICA_TTL_S) -> int:
        """Drop records of replicas gone for long (their host died without deregistering); how many."""
        ...


class RedisReplicaDirectory(ReplicaDirectory):
    """`ReplicaDirectory` in one Redis hash shared by all hosts; the client is passed in."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def announce(self, record: ReplicaRecord) -> None:
        self._redis.hset(REPLICAS_KEY, record.replica_id, json.dumps(record.to_dict()))

    def remove(self, replica_id: str) -> None:
        self._redis.hdel(REPLICAS_KEY, replica_id)

    def all(self) -> list[ReplicaRecord]:
        records = []
        for raw in self._redis.hvals(REPLICAS_KEY):
            try:
                records.append(ReplicaRecord.from_dict(json.loads(raw)))
            except (ValueError, TypeError, KeyError):
                continue  # a record from another Sluice version: not routable by this one
        return sorted(records, key=lambda r: r.replica_id)

    def live(self, now: float, api: str | None = None, ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
        return live_among(self.all(), now, api, ttl_s)

    def routable(self, now: float, api: str | None = None, ttl_s: float = REPLICA_TTL_S) -> list[ReplicaRecord]:
        return routable_among(self.all(), now, api, ttl_s)

    def forget_silent(self, now: float, older_than_s: float = 60 * REPLICA_TTL_S) -> int:
        gone = [r.replica_id for r in self.all() if now - r.seen > older_than_s]
        if gone:
            self._redis.hdel(REPLICAS_KEY, *gone)
        return len(gone)


class ReadinessMarkers:
    """Marker files, one per gunicorn process of a replica, in the replica's state folder.

    A process writes `ready-<pid>` once its predictor is built, or `failed-<pid>` with the
    reason. Markers of processes that no longer exist do not count, so a process that died and
    was replaced by gunicorn makes the replica not ready until the new one has built.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def mark_ready(self, pid: int | None = None) -> None:
        self._write(f"ready-{pid or os.getpid()}", "")

    def mark_failed(self, message: str, pid: int | None = None) -> None:
        self._write(f"failed-{pid or os.getpid()}", message)

    def note_out_of_memory(self, message: str, pid: int | None = None) -> None:
        """A process of the replica is leaving for memory (its memory guard acted): its launcher records it."""
        self._write(f"oom-{pid or os.getpid()}-{time.time_ns()}", message)

    def take_out_of_memory_notes(self) -> list[str]:
        """The notes of processes that left for memory since the last call, oldest first (each read once)."""
        if not self.folder.is_dir():
            return []
        said = []
        for path in sorted(self.folder.glob("oom-*"), key=lambda p: p.name.rsplit("-", 1)[-1]):
            with contextlib.suppress(OSError):
                said.append(path.read_text(encoding="utf-8"))
                path.unlink()
        return said

    def _write(self, name: str, text: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        staging = self.folder / f".{name}.tmp"
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, self.folder / name)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _live(self, prefix: str) -> dict[int, Path]:
        found: dict[int, Path] = {}
        if not self.folder.is_dir():
            return found
        for path in self.folder.glob(f"{prefix}-*"):
            try:
                pid = int(path.name.split("-", 1)[1])
            except ValueError:
                continue
            if self._alive(pid):
                found[pid] = path
            else:
                path.unlink(missing_ok=True)
        return found

    def ready_count(self) -> int:
        return len(self._live("ready"))

    def all_ready(self, expected: int) -> bool:
        return self.ready_count() >= expected

    def failure(self) -> str:
        """The reason a live process gave for failing to build its predictor, or ""."""
        for path in self._live("failed").values():
            try:
                return path.read_text(encoding="utf-8")
            except OSError:
                continue
        return ""
