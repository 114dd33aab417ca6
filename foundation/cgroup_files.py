"""Reading and writing the files of the host's control groups (cgroup v1 and v2), for the memory
and CPU limits of Sluice's process trees (`memory_limits.py`, `cpu_limits.py`)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

# Every folder Sluice makes in a control-group hierarchy starts so.
GROUP_PREFIX = "sluice-"


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except OSError:
        return ""


def counter(text: str, name: str) -> int:
    match = re.search(rf"^{re.escape(name)} (\d+)$", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def kill_all(procs_file: Path) -> None:
    for line in read_text(procs_file).split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(line), signal.SIGKILL)


def remove_group(path: Path, procs_file: Path) -> None:
    """rmdir the group once its processes are gone (a killed process leaves it a moment later)."""
    deadline = time.monotonic() + 5.0
    while True:
        kill_all(procs_file)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("memory group %s could not be removed: %s", path, e)
                return
            time.sleep(0.05)


def own_group(version: int, controller: str = "memory") -> str | None:
    """This process's group path in the hierarchy of `controller` (v1) or the unified one (v2)."""
    for line in read_text(Path("/proc/self/cgroup")).splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if version == 2 and number == "0" and controllers == "":
            return path
        if version == 1 and controller in controllers.split(","):
            return path
    return None


def mount_of(kind: str, option: str | None = None) -> Path | None:
    """Where a cgroup file system of `kind` (cgroup, cgroup2) is mounted, with `option` among its options."""
    for line in read_text(Path("/proc/self/mounts")).splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == kind and (option is None or option in parts[3].split(",")):
            return Path(parts[1])
    return None


def writable_dir(parent: Path, name: str) -> Path | None:
    """`parent/name` when it can be made there (tried, and removed again if it was not there: it is
    made when a first group needs it, so that a process that only asks leaves nothing behind); None
    where it cannot be."""
    path = parent / name
    existed = path.is_dir()
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    if not existed:
        with contextlib.suppress(OSError):
            path.rmdir()
    return path


def v1_groups_base(controller: str) -> Path | None:
    """Where this process may make its groups of cgroup v1's `controller`: a folder of its own under
    its group in that hierarchy (made when a first group needs it); None where it cannot."""
    mount = mount_of("cgroup", controller)
    own = own_group(1, controller)
    if mount is None or own is None:
        return None
    return writable_dir(mount / own.lstrip("/"), f"{GROUP_PREFIX}groups-{os.getpid()}")


def v2_delegated(controller: str) -> Path | None:
    """This process's cgroup v2 group, once it hands `controller` down to child groups; None where the
    subtree is not delegated. v2 keeps processes out of inner groups, so the group's processes move
    into a leaf of their own first (for every controller alike: whichever is handed down first)."""
    mount = mount_of("cgroup2")
    own = own_group(2)
    if mount is None or own is None:
        return None
    group = mount / own.lstrip("/")
    if controller not in read_text(group / "cgroup.controllers").split():
        return None
    control = group / "cgroup.subtree_control"
    try:
        if controller not in read_text(control).split():
            if read_text(group / "cgroup.procs").split():
                leaf = group / f"{GROUP_PREFIX}self"
                leaf.mkdir(exist_ok=True)
                for pid in read_text(group / "cgroup.procs").split():
                    (leaf / "cgroup.procs").write_text(pid, encoding="ascii")
            control.write_text(f"+{controller}", encoding="ascii")
    except OSError:
        return None
    return group
