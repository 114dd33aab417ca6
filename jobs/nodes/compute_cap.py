"""A worker node's own memory limit and CPU weight: its API's `compute.mem` and `compute.cpu` for the
batch it runs, written into the files its agent gave it (`foundation/memory_limits.py`: a cgroup's
limit, or the file the agent's watchdog reads; `foundation/cpu_limits.py`: the group's weight).

A node runs batches of any job placed on it, one at a time, so its limit follows the job: before
each batch is built and run it becomes that job's `compute.mem` plus Sluice's own part of a node
(`NODE_MARGIN_BYTES`), or the limit the node started with (its host's memory) for a job that sets
none; its CPU weight becomes the job's `compute.cpu` (Cortex's default for a batch: 1 cpu). A limit
below what the node holds now (another job's predictor it keeps cached) cannot be written; the node
then keeps the higher one and says so. A node started without these files (by hand, or by
`sluice up` without an agent) has neither.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from foundation.cpu_limits import WEIGHT_FILE_VARIABLE, weight_of
from foundation.hosts import BadQuantity, cpu_millis, mem_bytes
from foundation.memory_limits import LIMIT_FILE_VARIABLE, NODE_MARGIN_BYTES

log = logging.getLogger(__name__)


class ComputeCap:
    """The node's memory limit and CPU weight, written when the job it runs changes them."""

    def __init__(self, limit_file: Path | None, weight_file: Path | None = None) -> None:
        self._file = limit_file
        self._initial = self._read()
        self._current = self._initial
        self._weight_file = weight_file
        self._weight: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ComputeCap:
        env = os.environ if env is None else env
        limit, weight = env.get(LIMIT_FILE_VARIABLE), env.get(WEIGHT_FILE_VARIABLE)
        return cls(Path(limit) if limit else None, Path(weight) if weight else None)

    def require_compute(self, compute: Mapping[str, Any] | None) -> None:
        """Set both for a job of this `compute` section."""
        compute = compute or {}
        self.require(compute.get("mem"))
        self.require_cpu(compute.get("cpu", 1))

    def require_cpu(self, cpu: str | int | float | None) -> None:
        """Set the CPU weight for a job of this `compute.cpu`."""
        if self._weight_file is None:
            return
        try:
            weight = weight_of(cpu_millis(cpu if cpu is not None else 1), 2 if self._weight_file.name == "cpu.weight"
                               else 1)
        except BadQuantity:
            return
        if weight == self._weight:
            return
        try:
            self._weight_file.write_text(str(weight), encoding="ascii")
        except OSError as e:
            log.warning("the node's cpu weight could not be set to %d: %s", weight, e)
            return
        self._weight = weight

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
