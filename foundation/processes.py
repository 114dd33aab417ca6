"""Child processes tied to their parent's life."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

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
