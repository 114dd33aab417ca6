"""Printed lines are log lines (`foundation/printed_lines.py`): each whole line a record, in order, at INFO for
standard output and ERROR for standard error; a handler writing through the stream makes no record of a record."""

from __future__ import annotations

import io
import logging

from foundation.printed_lines import PrintedStream


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


def a_logger(name: str) -> tuple[logging.Logger, Kept]:
    logger = logging.getLogger(f"test.printed.{name}")
    logger.propagate, logger.handlers = False, []
    kept = Kept()
    logger.addHandler(kept)
    logger.setLevel(logging.DEBUG)
    return logger, kept


def test_each_whole_line_is_a_record_at_the_streams_level_partial_ones_wait_for_their_end() -> None:
    logger, kept = a_logger("lines")
    stream = PrintedStream(io.StringIO(), logging.ERROR, logger)

    print("one", file=stream)
    stream.write("two, in ")
    assert kept.records == [(logging.ERROR, "one")]
    stream.write("parts\nthree\n\n")

    assert kept.records == [(logging.ERROR, "one"), (logging.ERROR, "two, in parts"), (logging.ERROR, "three")]


def test_a_handler_writing_to_the_stream_itself_writes_through_without_a_new_record() -> None:
    logger, kept = a_logger("through")
    real = io.StringIO()
    stream = PrintedStream(real, logging.INFO, logger)
    logger.addHandler(logging.StreamHandler(stream))  # e.g. a handler a library set up after the streams

    print("hello", file=stream)

    assert kept.records == [(logging.INFO, "hello")]
    assert real.getvalue() == "hello\n"  # the handler's own line, through to the real stream once
