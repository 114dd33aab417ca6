"""A worker node's own memory limit: its API's `compute.mem` for the batch it runs, written into
the limit file its agent gave it (`foundation/memory_limits.py`: a cgroup's limit, or the file the
agent's watchdog reads).

A node runs batches of any job placed on it, one at a time, so its limit follows the job: before
each batch is built and run it becomes that job's `compute.mem` plus Sluice's own part of a node
(`NODE_MARGIN_BYTES`), or the limit the node started with (its host's memory) for a job that sets
none. A limit below what the node holds now (another job's predictor it keeps cached) cannot be
written; the node then keeps the higher one and says so. A node started without a limit file (by
hand, or by `sluice up` without an agent) has no limit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from foundation.hosts import BadQuantity, mem_bytes
from foundation.memory_limits import LIMIT_FILE_VARIABLE, NODE_MARGIN_BYTES

log = logging.getLogger(__name__)


class MemoryCap:
    """The node's limit, written when the job it runs changes it."""

    def __init__(self, limit_file: Path | None) -> None:
        self._file = limit_file
        self._initial = self._read()
        self._current = self._initial

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MemoryCap:
        value = (os.environ if env is None else env).get(LIMIT_FILE_VARIABLE)
        return cls(Path(value) if value else None)

    def _read(self) -> int | None:
        if self._file is None:
            return None
        try:
            text = self._file.read_text(encoding="ascii").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    @property
    def current(self) -> int | None:
        return self._current

    def require(self, compute_mem: str | int | None) -> None:
        """Set the limit for a job of this `compute.mem` (None: the limit the node started with)."""
        if self._file is None:
            return
        try:
            wanted = mem_bytes(compute_mem) + NODE_MARGIN_BYTES if compute_mem else self._initial
        except BadQuantity:
            wanted = self._initial
        if wanted is None or wanted == self._current:
            return
        try:
            self._file.write_text(str(wanted), encoding="ascii")
        except OSError as e:  # it holds more than that now (cgroup v1 refuses with EBUSY)
            log.warning("the node's memory limit stays at %s bytes: %d cannot be set now (%s)", self._current,
                        wanted, e)
            return
        self._current = wanted
