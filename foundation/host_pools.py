"""Host pools: groups of identical hosts that something outside Sluice adds and removes.

On Kubernetes each pool is one Deployment of host pods (`deploy/helm/sluice`), and KEDA sets how
many pods it has from the figure Sluice publishes for it (`sluice_host_pool_wanted`,
`jobs/placement/host_demand.py`). Sluice still decides what runs on which host, as it does on
plain machines; to say how many more hosts of a pool would hold what placement could not place,
it must know what one host of the pool offers before any exists (a pool scaled to zero has no host
to ask). So the pools are declared where beat runs, in `SLUICE_HOST_POOLS`, and each host says
which pool it belongs to (`sluice workers --pool`, `sluice replicas --pool`).

`SLUICE_HOST_POOLS` is a JSON list; each entry names a pool, its role (`workers` or `replicas`),
the hardware its hosts serve (`cpu`, `gpu`, `inf`) and what one host offers, written as the
host's own `--cpu`, `--mem` and `--gpu`:

    [{"name": "workers-cpu", "role": "workers", "hardware": "cpu", "cpu": "4", "mem": "8Gi"}]
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .hosts import BadQuantity, Resources

VARIABLE = "SLUICE_HOST_POOLS"
ROLES = ("workers", "replicas")
HARDWARE = ("cpu", "gpu", "inf")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a Kubernetes label value, and a Deployment's name part
_FIELDS = {"name", "role", "hardware", "cpu", "mem", "gpu"}


@dataclass(frozen=True)
class HostPool:
    """One pool: hosts of `role` serving `hardware`, each offering `offers`."""

    name: str
    role: str
    hardware: str
    offers: Resources


def parse_host_pools(raw: str | None) -> tuple[HostPool, ...]:
    """The pools `SLUICE_HOST_POOLS` declares (none when unset); a `ConfigError` naming the entry
    and the field when one cannot be used."""
    if not raw or not raw.strip():
        return ()
    try:
        entries = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{VARIABLE}: not JSON ({e})") from e
    if not isinstance(entries, list):
        raise ConfigError(f"{VARIABLE}: expected a JSON list of pools, got {type(entries).__name__}")
    pools = tuple(_pool(i, entry) for i, entry in enumerate(entries))
    names = [p.name for p in pools]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{VARIABLE}: pool names must differ ({', '.join(repeated)} repeated)")
    return pools


def _pool(index: int, entry: Any) -> HostPool:
    where = f"{VARIABLE}[{index}]"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: expected an object, got {entry!r}")
    unknown = sorted(set(entry) - _FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_FIELDS))})")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}.name: lower-case letters, digits and '-', at most 63 (got {name!r})")
    role = entry.get("role")
    if role not in ROLES:
        raise ConfigError(f"{where}.role: one of {', '.join(ROLES)} (got {role!r})")
    hardware = entry.get("hardware", "cpu")
    if hardware not in HARDWARE:
        raise ConfigError(f"{where}.hardware: one of {', '.join(HARDWARE)} (got {hardware!r})")
    try:
        offers = Resources.parse(cpu=entry.get("cpu", 0), mem=entry.get("mem", 0), gpu=entry.get("gpu", 0))
    except BadQuantity as e:
        raise ConfigError(f"{where}: {e}") from e
    if offers.cpu_m <= 0:
        raise ConfigError(f"{where}.cpu: what one host of the pool offers, above 0 (got {entry.get('cpu')!r})")
    return HostPool(name, str(role), str(hardware), offers)
