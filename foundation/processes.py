"""Child processes tied to their parent's life, and trees of processes stopped whole."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Sequence

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when its parent (a launcher, a worker host agent, a worker
    node) dies, however it dies."""

    def preexec() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        except (OSError, AttributeError):  # not Linux: the parent's own exit handling still applies
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return preexec


def tree_of(pid: int) -> list[psutil.Process]:
    """The process `pid` and every process under it, as they are now (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def describe(process: psutil.Process) -> str:
    """`pid N: <command line>` for a message that names a process."""
    try:
        command = " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        command = "?"
    return f"pid {process.pid}: {command[:160]}"


def stop_trees(roots: Sequence[tuple[str, int]], grace_s: float, sig: int = signal.SIGTERM) -> list[str]:
    """Send `sig` to each root process, wait up to `grace_s` for every process of their trees to end,
    then SIGKILL what is left; one line per killed process, naming its tree and command.

    The trees are read before the signal, so a process that outlives its parent (a worker node whose
    worker host ended first, a replica whose launcher did) is waited for and killed all the same;
    a root's own handling of `sig` (a warm shutdown) has the whole grace to finish.
    """
    trees = [(name, pid, tree_of(pid)) for name, pid in roots]
    for _, pid, tree in trees:
        if tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    every = [process for _, _, tree in trees for process in tree]
    alive = wait_until_ended(every, grace_s)
    killed = []
    for name, _, tree in trees:
        for process in tree:
            if process in alive:
                killed.append(f"{name} {describe(process)}")
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
    wait_until_ended(alive, 5.0)
    return killed


def running(process: psutil.Process) -> bool:
    """Whether `process` still runs: a zombie has ended (its parent may be gone, or an init that
    never reaps it, as in some containers)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_ended(processes: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to `timeout_s` for every one of `processes` to end (reaping those that are this
    process's children); those still running then."""
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        for process in processes:  # reaps our own children, so that they do not linger as zombies
            with contextlib.suppress(psutil.Error, ChildProcessError):
                process.wait(timeout=0)
        alive = [process for process in processes if running(process)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)
