"""Reading the tests' processes from /proc: which processes a process started."""

from __future__ import annotations

import os


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (whichever of its threads started them)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        if parent == pid:
            children.append(int(entry))
    return children


def command_of(pid: int) -> str:
    """The process's command line, its arguments joined by spaces."""
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().replace(b"\0", b" ").decode()
