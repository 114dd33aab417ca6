"""Printed lines are log lines, as they were on Cortex, where a predictor's standard output was its log.

A process that runs predictors (a worker node, an API's environment process, a realtime replica)
replaces its `sys.stdout` and `sys.stderr` with streams that turn each whole line written to them
into a log record of the logger `PRINTED_LOGGER`: INFO for standard output, ERROR for standard
error. So a predictor's `print()` goes where its logged lines go, with the same labels (the job,
the batch, the API, the node: the thread's capture, `foundation/log_streams.py`), and in order
with them; `sluice logs` shows it.

Nothing is done for a process that prints nothing: a write only splits lines. A handler that
writes to one of these streams itself (a handler set up after them) writes through, so a record
never becomes another record. Code that needs the real stream still has it: `sys.__stdout__`,
`sys.__stderr__`, and each stream's `fileno()`.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
from typing import TextIO

PRINTED_LOGGER = "print"


class PrintedStream(io.TextIOBase):
    """A text stream whose whole lines become log records at `level`; other writes pass to `original`."""

    def __init__(self, original: TextIO, level: int, logger: logging.Logger | None = None) -> None:
        super().__init__()
        self.original = original
        self.level = level
        self._logger = logger or logging.getLogger(PRINTED_LOGGER)
        self._local = threading.local()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        local = self._local
        if getattr(local, "emitting", False):  # a handler writing through this stream: no record of a record
            return self.original.write(text)
        pending: str = getattr(local, "pending", "") + text
        *lines, local.pending = pending.split("\n")
        if lines:
            local.emitting = True
            try:
                for line in lines:
                    if line.strip():
                        self._logger.log(self.level, line.rstrip("\r"))
            finally:
                local.emitting = False
        return len(text)

    def flush(self) -> None:
        # A line is a record once it ends: a progress bar's carriage returns stay one line until then.
        self.original.flush()

    def fileno(self) -> int:
        return self.original.fileno()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.original, "encoding", None) or "utf-8"


def print_to_log() -> None:
    """Make this process's standard output and standard error log lines (once; a second call keeps them)."""
    if not isinstance(sys.stdout, PrintedStream):
        sys.stdout = PrintedStream(sys.stdout, logging.INFO)
    if not isinstance(sys.stderr, PrintedStream):
        sys.stderr = PrintedStream(sys.stderr, logging.ERROR)
