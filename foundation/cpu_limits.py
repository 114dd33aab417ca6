"""An API's `compute.cpu` as the CPU its process trees get: a weight against every other tree on the
host, or, on request, a hard quota.

`SLUICE_CPU_LIMITS`: `share` (the default) makes `compute.cpu` the group's weight (cgroup v2's
`cpu.weight`, 100 per cpu; cgroup v1's `cpu.shares`, 1024 per cpu), so two APIs whose trees are
busy at once on one host get CPU in proportion to what they asked, and a tree alone on an idle
host may use all of it. `quota` caps each tree at what it asked as well (`cpu.max`, or v1's
`cpu.cfs_quota_us`), for operators who want a replica never to run past its share even on an idle
host. `off` leaves the CPU to the kernel's defaults. The groups sit beside the memory groups
(`foundation/memory_limits.py`): under cgroup v2 they are the same folder, under v1 a folder of
the cpu hierarchy. Where no cpu controller is writable, the setting says so once and nothing is
limited (a watchdog cannot share CPU).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .cgroup_files import GROUP_PREFIX, remove_group, v1_groups_base, v2_delegated
from .errors import ConfigError

SETTING = "SLUICE_CPU_LIMITS"
PERIOD_US = 100_000
# The variable that tells a worker node where its weight file is (its agent sets it).
WEIGHT_FILE_VARIABLE = "SLUICE_CPU_WEIGHT_FILE"


def weight_of(cpu_millis: int, version: int) -> int:
    """The group's weight for `cpu_millis`: v2 `cpu.weight` (1..10000, 100 a cpu), v1 `cpu.shares`
    (2.., 1024 a cpu)."""
    if version == 2:
        return max(1, min(10_000, round(cpu_millis / 10)))
    return max(2, cpu_millis * 1024 // 1000)


@dataclass
class CpuGroup:
    """One process tree's CPU: its weight, and with a quota its cap."""

    path: Path
    version: int
    cpu_millis: int
    quota: bool

    @property
    def weight_file(self) -> Path:
        return self.path / ("cpu.weight" if self.version == 2 else "cpu.shares")

    def set(self, cpu_millis: int) -> None:
        """Write the weight (and the quota) for `cpu_millis`."""
        self.weight_file.write_text(str(weight_of(cpu_millis, self.version)), encoding="ascii")
        if self.quota:
            if self.version == 2:
                (self.path / "cpu.max").write_text(f"{cpu_millis * PERIOD_US // 1000} {PERIOD_US}", encoding="ascii")
            else:
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US), encoding="ascii")
                (self.path / "cpu.cfs_quota_us").write_text(str(cpu_millis * PERIOD_US // 1000), encoding="ascii")
        self.cpu_millis = cpu_millis

    def join(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid), encoding="ascii")

    def close(self) -> None:
        """Under v2 it is the memory group's folder too (one group a process): whichever closes last removes it."""
        remove_group(self.path, self.path / "cgroup.procs")


@dataclass
class CpuLimits:
    """The way this process gives its trees CPU, and the groups it makes (`group`)."""

    reason: str
    version: int = 0           # 0: no cpu controller here, or `off`
    base: Path | None = None
    quota: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CpuLimits:
        env = os.environ if env is None else env
        wanted = (env.get(SETTING) or "share").strip().lower()
        if wanted not in ("share", "quota", "off"):
            raise ConfigError(f"{SETTING} must be share, quota or off (got {wanted!r})")
        if wanted == "off":
            return cls(f"{SETTING}=off: compute.cpu is not a share")
        quota = wanted == "quota"
        found = _v2(quota) or _v1(quota)
        if found is None:
            return cls("no writable cpu controller here: compute.cpu is not a share")
        return found

    def group(self, name: str, cpu_millis: int) -> CpuGroup | None:
        """A group giving one tree `cpu_millis` worth of CPU (None when there is no cpu controller).
        Named as the tree's memory group: under v2 they are one folder."""
        if self.version == 0 or self.base is None:
            return None
        path = self.base / f"{GROUP_PREFIX}{name}"
        path.mkdir(parents=True, exist_ok=True)
        group = CpuGroup(path, self.version, cpu_millis, self.quota)
        group.set(cpu_millis)
        return group

    def close(self) -> None:
        if self.base is not None and self.version == 1:
            with contextlib.suppress(OSError):
                self.base.rmdir()


def _v1(quota: bool) -> CpuLimits | None:
    base = v1_groups_base("cpu")
    if base is None:
        return None
    return CpuLimits(f"cgroup v1's cpu controller, groups under {base}", 1, base, quota)


def _v2(quota: bool) -> CpuLimits | None:
    """The delegated v2 subtree the memory groups use, with the cpu controller handed down too."""
    group = v2_delegated("cpu")
    if group is None:
        return None
    return CpuLimits(f"cgroup v2, groups under {group}", 2, group, quota)
