"""Hosts and the room they offer: what placement shares between replicas and worker nodes.

An agent on each host (`sluice replicas`, `sluice up`, a worker host's agent) declares what the
host offers (`--cpu`, `--mem`, `--gpu`; by default the machine's cores, memory and GPUs) and
announces it every heartbeat as a `HostRecord`. Placement (run in beat) reads the live hosts and
puts each replica or node, which takes its API's `compute` request, where it fits; a host whose
heartbeat stops is no longer live, and what ran there is placed elsewhere.

Quantities are written as Kubernetes (and so Cortex) wrote them: cpu `2`, `0.5` or `500m`,
memory `512Mi`, `2G` or bytes; they are held as whole millicores and bytes so that sums are exact.
`HostDirectory` is what callers type against; `RedisHostDirectory` keeps the records in one Redis
hash (`keys.HOSTS`), `foundation.memory.MemoryHostDirectory` in a dict for fast tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import redis

from foundation import keys
from foundation.errors import SluiceError

# A host silent for this many seconds is not offered to placement any more (the default of
# `SLUICE_HOST_TTL`, `Settings.host_ttl_s`).
HOST_TTL_S = 15.0

_CPU = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(m?)$")
_MEM = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)?$")
_MEM_UNITS = {
    None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


class BadQuantity(SluiceError, ValueError):
    """A cpu or memory quantity that is not written as Kubernetes writes one."""


def cpu_millis(value: float | int | str) -> int:
    """Millicores from `2`, `0.5`, `"1.5"` or `"500m"` (rounded up: a request never shrinks)."""
    if isinstance(value, bool):
        raise BadQuantity(f"cpu must be a number or a quantity such as '500m' (got {value!r})")
    text = f"{float(value):f}" if isinstance(value, (int, float)) else value.strip()
    match = _CPU.match(text)
    if match is None or float(match.group(1)) < 0:
        raise BadQuantity(f"cpu must be a number or a quantity such as '500m' (got {value!r})")
    amount = float(match.group(1))
    millis = amount if match.group(2) else amount * 1000
    return int(-(-millis // 1))


def mem_bytes(value: int | str) -> int:
    """Bytes from `1073741824`, `"512Mi"` or `"2G"`."""
    text = str(value).strip() if not isinstance(value, bool) else ""
    match = _MEM.match(text)
    if match is None:
        raise BadQuantity(f"mem must be a quantity such as '2G' or '512Mi' (got {value!r})")
    return int(-(-(float(match.group(1)) * _MEM_UNITS[match.group(2)]) // 1))


@dataclass(frozen=True)
class Resources:
    """An amount of cpu (millicores), memory (bytes), GPUs and Inferentia's Neuron cores (`inf`): what
    a host offers, or what one replica or node takes."""

    cpu_m: int = 0
    mem: int = 0
    gpu: int = 0
    inf: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu_m + other.cpu_m, self.mem + other.mem, self.gpu + other.gpu, self.inf + other.inf)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu_m - other.cpu_m, self.mem - other.mem, self.gpu - other.gpu, self.inf - other.inf)

    def fits_in(self, room: Resources) -> bool:
        """Whether this much can be taken from `room`."""
        return (self.cpu_m <= room.cpu_m and self.mem <= room.mem and self.gpu <= room.gpu
                and self.inf <= room.inf)

    def to_dict(self) -> dict[str, int]:
        return {"cpu_m": self.cpu_m, "mem": self.mem, "gpu": self.gpu, "inf": self.inf}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Resources:
        return cls(int(d.get("cpu_m", 0)), int(d.get("mem", 0)), int(d.get("gpu", 0)), int(d.get("inf", 0)))

    def shortfall(self, room: Resources) -> str:
        """What `room` lacks to hold this much, as a user reads it ("1 gpu", "500m cpu"); empty
        when it fits."""
        missing = []
        if self.gpu > room.gpu:
            missing.append(f"{self.gpu} gpu")
        if self.inf > room.inf:
            missing.append(f"{self.inf} inf")
        if self.cpu_m > room.cpu_m:
            missing.append(f"{self.cpu_m}m cpu")
        if self.mem > room.mem:
            missing.append(f"{self.mem // 2**20}Mi mem")
        return ", ".join(missing)

    @classmethod
    def parse(cls, cpu: float | int | str = 0, mem: int | str = 0, gpu: int = 0, inf: int = 0) -> Resources:
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise BadQuantity(f"gpu must be a whole number of GPUs, 0 or more (got {gpu!r})")
        if isinstance(inf, bool) or not isinstance(inf, int) or inf < 0:
            raise BadQuantity(f"inf must be a whole number of Neuron cores, 0 or more (got {inf!r})")
        return cls(cpu_millis(cpu), mem_bytes(mem), gpu, inf)


def gpus_found() -> int:
    """The NVIDIA GPUs this machine has (`nvidia-smi -L`), 0 when there is no driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def memory_found() -> int:
    """This machine's memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def machine_resources() -> Resources:
    """What this machine has: the cores this process may use, its memory and its GPUs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Resources(cores * 1000, memory_found(), gpus_found())


@dataclass(frozen=True)
class HostRecord:
    """One host as placement sees it; `to_dict()` is the stored form."""

    host_id: str          # stable for the agent's life: placement's assignments name it
    address: str          # where the proxy reaches its replicas (for operators)
    offers: Resources     # the room it declared
    hardware: str | None  # "cpu" or "gpu" when it serves only those APIs, None for every one
    roles: tuple[str, ...]  # what its agent runs: "replicas", "workers"
    seen: float           # time of the last heartbeat (epoch seconds)
    pool: str | None = None  # the host pool it belongs to (`--pool`; foundation/host_pools.py), if any
    # Records of one machine that share its room (`sluice up`'s worker host and replica host, or
    # `--room` given to both): what one's placement takes, the other's cannot ("" for a host alone).
    room: str = ""

    def live(self, now: float, ttl_s: float = HOST_TTL_S) -> bool:
        return now - self.seen <= ttl_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["roles"] = list(self.roles)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HostRecord:
        offers = d["offers"]
        return cls(str(d["host_id"]), str(d["address"]), Resources.from_dict(offers),
                   d.get("hardware"), tuple(d.get("roles", ())), float(d["seen"]), d.get("pool"),
                   str(d.get("room") or ""))


class HostDirectory(Protocol):
    """Where hosts announce the room they offer."""

    def announce(self, record: HostRecord) -> None:
        """Write (or rewrite, every heartbeat) a host's record."""

    def remove(self, host_id: str) -> None:
        """A host's agent stopped cleanly."""

    def all(self) -> list[HostRecord]:
        """Every record, live or not, sorted by host id."""

    def live(self, now: float, ttl_s: float = HOST_TTL_S) -> list[HostRecord]:
        """The hosts heard from within `ttl_s`, sorted by host id."""


class RedisHostDirectory:
    """`HostDirectory` in one Redis hash (`keys.HOSTS`: host id -> JSON)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def announce(self, record: HostRecord) -> None:
        self._redis.hset(keys.HOSTS, record.host_id, json.dumps(record.to_dict()))

    def remove(self, host_id: str) -> None:
        self._redis.hdel(keys.HOSTS, host_id)

    def all(self) -> list[HostRecord]:
        records = [HostRecord.from_dict(json.loads(raw)) for raw in self._redis.hvals(keys.HOSTS)]
        return sorted(records, key=lambda r: r.host_id)

    def live(self, now: float, ttl_s: float = HOST_TTL_S) -> list[HostRecord]:
        return [r for r in self.all() if r.live(now, ttl_s)]


def shared_room(records: Iterable[HostRecord], role: str, of_role: Mapping[str, Resources]) -> dict[str, Resources]:
    """For each record of `role`: what the records of the other roles that share its room take
    (`of_role`: record id -> what is placed on it)."""
    by_room: dict[str, list[HostRecord]] = {}
    for record in records:
        if record.room:
            by_room.setdefault(record.room, []).append(record)
    taken: dict[str, Resources] = {}
    for sharing in by_room.values():
        others = sum((of_role.get(r.host_id, Resources()) for r in sharing if role not in r.roles), Resources())
        for record in sharing:
            if role in record.roles:
                taken[record.host_id] = others
    return taken
