"""Memory limits of the process trees Sluice starts for an API (a realtime replica, a worker node),
so that one API outgrowing its `compute.mem` is stopped alone, and nothing else on the host is touched.

Three ways, chosen once per process (`SLUICE_MEMORY_LIMITS`: `auto`, the default, `cgroup`,
`watchdog` or `off`) and said once in its log:

- **cgroup v2**, where the host delegates a subtree to Sluice (systemd's `Delegate=yes`, a
  container's own cgroup namespace): a group per tree under Sluice's own, `memory.max` = the
  limit, swap off (`memory.swap.max` 0). Over it, the kernel's OOM killer stops a process of that
  group and no other; `memory.events` counts it.
- **cgroup v1**, where the memory controller is mounted and Sluice's group in it is writable (as
  on hosts with a hybrid hierarchy): the same with `memory.limit_in_bytes` (and
  `memory.memsw.limit_in_bytes`, where swap is accounted); `memory.oom_control` counts the kills.
- **watchdog**, where neither is writable: the launcher adds up the resident memory of the tree
  (psutil) every step and stops the largest process past the limit, as the OOM killer would.
  It looks four times a second, so a tree that grows faster can go past its limit in between, and
  the host's own OOM killer may then pick another process: only the cgroup modes guarantee that
  nothing else is touched.

A tree joins its group as soon as its first process is started (the launcher writes its pid into
the group before that process has started any other), so every process it forks is inside.

What a tree is given is its API's `compute.mem` plus Sluice's own part of it: `ARBITER_BYTES` for
gunicorn's arbiter and `OWN_MARGIN_BYTES` for each replica process (Python, Flask, gunicorn,
numpy, the figures, log and build threads). Measured on a replica serving a predictor that holds
nothing, after 200 requests: arbiter 27 MiB, process 69 MiB resident (sync and gthread alike;
tests/integration/test_memory_limits.py measures it again and holds the margins above it). The
process margin was 64 MiB when it measured 59; the process grew past it as its imports did, so
it has room now: 96 MiB.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from .cgroup_files import GROUP_PREFIX, counter, read_text, remove_group, v1_groups_base, v2_delegated
from .errors import ConfigError

log = logging.getLogger(__name__)

SETTING = "SLUICE_MEMORY_LIMITS"
# Sluice's own part of a replica's memory (see the module docstring): its arbiter, and each process.
ARBITER_BYTES = 32 * 1024 * 1024
OWN_MARGIN_BYTES = 96 * 1024 * 1024
# ... and of a worker node: Celery, kombu and the batch runtime in one process. Measured at 77 MiB
# resident after three batches of a predictor that holds nothing (tests/integration/
# test_embedded_worker_host.py holds it under this); the rest is room for a batch's input and records.
NODE_MARGIN_BYTES = 128 * 1024 * 1024
# The variable that tells a worker node where its limit file is (its agent sets it).
LIMIT_FILE_VARIABLE = "SLUICE_MEMORY_LIMIT_FILE"
CGROUP_ROOT = Path("/sys/fs/cgroup")


class LimitMode(StrEnum):
    CGROUP_V2 = "cgroup v2"
    CGROUP_V1 = "cgroup v1"
    WATCHDOG = "watchdog"
    OFF = "off"


class MemoryGroup(Protocol):
    """One process tree's memory limit."""

    limit: int

    @property
    def limit_file(self) -> Path:
        """The file that holds the limit: the process tree may write a new one there (a worker node
        does, for the job whose batch it runs)."""
        ...

    @property
    def usage_file(self) -> Path | None:
        """The file the kernel keeps the group's usage in, for the tree's own guard; None when watched."""
        ...

    def join(self, pid: int) -> None:
        """Put the tree's first process (and so every process it starts afterwards) in the group."""
        ...

    def check(self) -> None:
        """Enforce the limit where the kernel does not (the watchdog); nothing for a cgroup."""
        ...

    def oom_kills(self) -> int:
        """Processes of the tree stopped for memory so far."""
        ...

    def peak(self) -> int:
        """The most memory the tree held at once, in bytes, as far as it was seen."""
        ...

    def close(self) -> None:
        """Stop what is left of the tree and remove the group."""
        ...


@dataclass
class CgroupGroup:
    """A group of cgroup v1's memory controller or of cgroup v2, made by `MemoryLimits.group`."""

    path: Path
    limit: int
    version: int
    _peak_seen: int = 0

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")

    @property
    def usage_file(self) -> Path | None:
        return self.path / ("memory.current" if self.version == 2 else "memory.usage_in_bytes")

    def join(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid), encoding="ascii")

    def check(self) -> None:
        text = read_text(self.limit_file).strip()
        if text.isdigit():
            self.limit = int(text)
        if self.version == 2 and not (self.path / "memory.peak").exists():  # kernels before 5.19
            current = read_text(self.path / "memory.current").strip()
            self._peak_seen = max(self._peak_seen, int(current or 0))

    def oom_kills(self) -> int:
        if self.version == 2:
            return counter(read_text(self.path / "memory.events"), "oom_kill")
        return counter(read_text(self.path / "memory.oom_control"), "oom_kill")

    def peak(self) -> int:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        text = read_text(self.path / name).strip()
        return max(int(text) if text.isdigit() else 0, self._peak_seen)

    def close(self) -> None:
        remove_group(self.path, self.path / "cgroup.procs")


@dataclass
class WatchdogGroup:
    """The limit kept by looking: the tree's resident memory added up, its largest process stopped
    past the limit."""

    limit: int
    name: str = ""
    folder: Path | None = None    # where its limit file is (a worker node writes a new limit there)
    _root: int | None = None
    _kills: int = 0
    _peak: int = 0
    _pids: set[int] = field(default_factory=set)

    @property
    def limit_file(self) -> Path:
        assert self.folder is not None, "a watched group made by MemoryLimits.group has a folder"
        return self.folder / f"{GROUP_PREFIX}{self.name}.limit"

    @property
    def usage_file(self) -> Path | None:
        return None

    def join(self, pid: int) -> None:
        if pid <= 1:  # never the whole machine's tree
            raise OSError(f"no process tree to watch at pid {pid}")
        self._root = pid

    def _tree(self) -> list[object]:
        import psutil

        if self._root is None:
            return []
        try:
            root = psutil.Process(self._root)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def check(self) -> None:
        import psutil

        if self.folder is not None:
            text = read_text(self.limit_file).strip()
            if text.isdigit():
                self.limit = int(text)
        sizes: list[tuple[int, int]] = []
        for process in self._tree():
            assert isinstance(process, psutil.Process)
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                sizes.append((process.memory_info().rss, process.pid))
        total = sum(size for size, _ in sizes)
        self._peak = max(self._peak, total)
        if total <= self.limit or not sizes:
            return
        size, pid = max(sizes)
        log.error("memory group %s holds %d bytes, over its limit of %d: stopping its largest process %d (%d bytes)",
                  self.name, total, self.limit, pid, size)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self._kills += 1

    def oom_kills(self) -> int:
        return self._kills

    def peak(self) -> int:
        return self._peak

    def close(self) -> None:
        self._root = None
        if self.folder is not None:
            with contextlib.suppress(OSError):
                self.limit_file.unlink()


@dataclass
class MemoryLimits:
    """The mode this process limits memory in, and the groups it makes (`group`)."""

    mode: LimitMode
    reason: str                   # why this mode, said once at start
    base: Path | None = None      # the folder its groups are made in (the cgroup modes)
    watch_folder: Path | None = None  # where watched groups keep their limit files (the watchdog)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, watch_folder: Path | None = None) -> MemoryLimits:
        """The mode `SLUICE_MEMORY_LIMITS` asks for, where this host allows it; `watch_folder` is
        where a watched group keeps its limit file."""
        found = cls._from_env(os.environ if env is None else env)
        found.watch_folder = watch_folder
        return found

    @classmethod
    def _from_env(cls, env: Mapping[str, str]) -> MemoryLimits:
        wanted = (env.get(SETTING) or "auto").strip().lower()
        if wanted not in ("auto", "cgroup", "watchdog", "off"):
            raise ConfigError(f"{SETTING} must be auto, cgroup, watchdog or off (got {wanted!r})")
        if wanted == "off":
            return cls(LimitMode.OFF, f"{SETTING}=off: compute.mem is not a limit")
        if wanted == "watchdog":
            return cls(LimitMode.WATCHDOG, f"{SETTING}=watchdog")
        found = _cgroup_v2() or _cgroup_v1()
        if found is not None:
            return found
        if wanted == "cgroup":
            raise ConfigError(f"{SETTING}=cgroup, but no cgroup v2 subtree is delegated to Sluice and cgroup v1's "
                              "memory controller is not writable here")
        return cls(LimitMode.WATCHDOG, "no cgroup v2 subtree is delegated to Sluice and cgroup v1's memory controller "
                                       "is not writable here: memory is watched, which the host's OOM killer may beat")

    def close(self) -> None:
        """Remove this process's folder of groups (each group is removed with its tree)."""
        if self.base is not None and self.mode is LimitMode.CGROUP_V1:
            with contextlib.suppress(OSError):
                self.base.rmdir()

    def group(self, name: str, limit: int, swap_too: bool = True) -> MemoryGroup | None:
        """A group for one process tree of at most `limit` bytes (None when limits are off).

        `swap_too`: cgroup v1 limits memory and swap together (`memory.memsw.limit_in_bytes`), which
        then bounds any new limit the tree writes: a tree that will write its own (a worker node)
        leaves swap alone (v2 turns swap off for every group)."""
        if self.mode is LimitMode.OFF:
            return None
        if self.mode is LimitMode.WATCHDOG or self.base is None:
            group = WatchdogGroup(limit, name, self.watch_folder)
            if self.watch_folder is not None:
                self.watch_folder.mkdir(parents=True, exist_ok=True)
                group.limit_file.write_text(str(limit), encoding="ascii")
            return group
        path = self.base / f"{GROUP_PREFIX}{name}"
        path.mkdir(parents=True, exist_ok=True)
        if self.mode is LimitMode.CGROUP_V2:
            (path / "memory.max").write_text(str(limit), encoding="ascii")
            with contextlib.suppress(OSError):
                (path / "memory.swap.max").write_text("0", encoding="ascii")
            return CgroupGroup(path, limit, 2)
        (path / "memory.limit_in_bytes").write_text(str(limit), encoding="ascii")
        if swap_too:
            with contextlib.suppress(OSError):  # swap accounting is off on some hosts
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit), encoding="ascii")
        return CgroupGroup(path, limit, 1)


def _cgroup_v1() -> MemoryLimits | None:
    base = v1_groups_base("memory")
    if base is None:
        return None
    return MemoryLimits(LimitMode.CGROUP_V1, f"cgroup v1's memory controller, groups under {base}", base)


def _cgroup_v2() -> MemoryLimits | None:
    group = v2_delegated("memory")
    if group is None:
        return None
    return MemoryLimits(LimitMode.CGROUP_V2, f"cgroup v2, groups under {group}", group)


def human_bytes(amount: int) -> str:
    """`amount` bytes as a person reads it: 300 MiB, 1.5 GiB."""
    if amount >= 1 << 30:
        return f"{amount / (1 << 30):.1f} GiB"
    return f"{amount / (1 << 20):.0f} MiB"


def replica_limit(mem: int, processes: int) -> int:
    """A replica's limit: its API's `compute.mem` and Sluice's own part of its processes."""
    return mem + ARBITER_BYTES + OWN_MARGIN_BYTES * processes
