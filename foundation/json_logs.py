"""Structured logs: one JSON object per line, with the job's labels, for workers and predictors.

A predictor logs through `logger` (`from foundation.json_logs import logger`) and may add
fields with `extra=`: they become top-level keys of the line (the extra dict is flattened one
level). The keys Sluice writes itself (`asctime`, `levelname`, `message`, `labels`, `process`)
cannot be overridden: such extra keys are dropped rather than failing the call. A line longer
than 5 MB is dropped, so one huge payload cannot flood the log.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, TextIO

RESERVED_KEYS = frozenset({"asctime", "levelname", "message", "labels", "process"})
MAX_LINE_BYTES = 5 * 1024 * 1024

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}

_labels: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("sluice_log_labels", default=None)
# Labels of every line this process writes (a worker node's name), under those of `labelled`.
_process_labels: dict[str, str] = {}


def set_process_labels(**labels: str) -> None:
    """Every line this process logs from now on carries these labels (a worker node: `node`)."""
    _process_labels.update(labels)


@contextlib.contextmanager
def labelled(**labels: str) -> Iterator[None]:
    """Every line logged inside the block carries these labels (e.g. the API and job it is for)."""
    token = _labels.set({**(_labels.get() or {}), **labels})
    try:
        yield
    finally:
        _labels.reset(token)


class JsonLinesFormatter(logging.Formatter):
    """Formats a record as one JSON object: Sluice's keys first, then the `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "message": record.getMessage(),
            "process": record.process,
        }
        labels = {**_process_labels, **(_labels.get() or {})}
        if labels:
            line["labels"] = labels
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in RESERVED_KEYS:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class JsonLinesHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes JSON lines to a stream, dropping any line over `MAX_LINE_BYTES`."""

    def __init__(self, stream: TextIO | None = None) -> None:
        # The real standard error, also where printed lines are log records (foundation/printed_lines.py).
        super().__init__(stream or getattr(sys.stderr, "original", sys.stderr))
        self.setFormatter(JsonLinesFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if len(line.encode("utf-8", "replace")) > MAX_LINE_BYTES:
                return
            self.stream.write(line + self.terminator)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a handler reports its failure, never raises it
            self.handleError(record)


class _ExtraGuard(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Drops `extra=` keys that would clash with Sluice's own (the stdlib would raise for some)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = kwargs.get("extra")
        if extra:
            kwargs["extra"] = {k: v for k, v in extra.items() if k not in RESERVED_KEYS and k not in _RECORD_ATTRIBUTES}
        return msg, kwargs


logger = _ExtraGuard(logging.getLogger("sluice.predictor"), {})


def configure_json_logging(level: int | str = logging.INFO, stream: TextIO | None = None) -> None:
    """Make the root logger write JSON lines (replacing its handlers); Sluice's processes call it at start."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(JsonLinesHandler(stream))
    root.setLevel(level)
