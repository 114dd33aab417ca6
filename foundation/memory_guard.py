"""A replica process's own watch on its memory group, so that the request whose predictor grows past
its API's `compute.mem` is answered `507 out_of_memory`, not cut off by the kernel.

Its launcher puts the replica in a memory group (`foundation/memory_limits.py`) and tells each of
its processes where the group's usage and limit are read (`SLUICE_MEMORY_USAGE_FILE`,
`SLUICE_MEMORY_LIMIT_FILE`). A thread reads them every `POLL_S`. Once the group holds all but
`GUARD_BYTES` of its limit while this process runs predictions, it raises `OutOfMemory` in the
threads running them (at their next Python instruction), whose requests are answered 507 naming
the limit and the usage; the process then leaves (its server starts another, with nothing held)
and notes the stop where its launcher reads it. A predictor that grows by more than the guard
between two reads, or inside one call to compiled code, is stopped by the kernel instead: its
request then gets the proxy's 502, and its launcher still records the stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from .errors import OutOfMemory
from .memory_limits import LIMIT_FILE_VARIABLE, human_bytes

log = logging.getLogger(__name__)

USAGE_FILE_VARIABLE = "SLUICE_MEMORY_USAGE_FILE"
POLL_S = 0.005
# What the group may still take once the guard acts: room for the answer and the process's exit.
GUARD_BYTES = 24 * 1024 * 1024


def _number(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class GuardTripped(BaseException):
    """Raised into a thread running a prediction when the guard acts: a BaseException, so that a
    predictor's own `except Exception` does not swallow it."""


class MemoryGuard:
    """Watches this process's memory group while it runs predictions."""

    def __init__(self, usage_file: Path, limit_file: Path, poll_s: float = POLL_S) -> None:
        self._usage_file, self._limit_file = usage_file, limit_file
        self._poll_s = poll_s
        self._running: set[int] = set()       # thread ids running a prediction
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.tripped: str = ""                # what it said when it acted ("" until it has)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MemoryGuard | None:
        """The guard its launcher asked for, None when the replica has no memory group to read."""
        env = os.environ if env is None else env
        usage, limit = env.get(USAGE_FILE_VARIABLE), env.get(LIMIT_FILE_VARIABLE)
        if not usage or not limit:
            return None
        return cls(Path(usage), Path(limit))

    @contextlib.contextmanager
    def predicting(self) -> Iterator[None]:
        """Around one prediction on this thread: it may end in `OutOfMemory`."""
        ident = threading.get_ident()
        with self._lock:
            self._running.add(ident)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="sluice-memory-guard", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(ident)

    def _watch(self) -> None:
        while not self.tripped:
            time.sleep(self._poll_s)
            with self._lock:
                if not self._running:
                    continue
            usage, limit = _number(self._usage_file), _number(self._limit_file)
            if usage is None or limit is None or usage < limit - GUARD_BYTES:
                continue
            self._trip(usage, limit)

    def _trip(self, usage: int, limit: int) -> None:
        self.tripped = (f"a process was stopped for memory: it held {human_bytes(usage)}, within "
                        f"{human_bytes(GUARD_BYTES)} of its limit of {human_bytes(limit)} (compute.mem and Sluice's "
                        "own part)")
        log.error("%s; its requests end out_of_memory and the process leaves", self.tripped)
        with self._lock:
            running = list(self._running)
        for ident in running:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(GuardTripped))

    def error(self) -> OutOfMemory:
        """The error a request interrupted by the guard is answered with."""
        return OutOfMemory(f"the predictor grew past its API's compute.mem: {self.tripped}")
