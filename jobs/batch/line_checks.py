"""Parsing a large local JSON-lines file in helper processes while the enqueuer cuts it.

A `delimited_files` job's workers start only once every line of its input was parsed (a malformed
line means nothing of the job ran), so the enqueuer's work is the whole wait before a job starts;
parsing each line is most of it, cutting and publishing the batches the rest
(`bench/onnx_batch.py`: about 0.2 s of a 1 s job of 200,000 small rows, one core busy while the
others wait). The parse needs the GIL for a whole block, so threads cannot share it; processes
can. For a local file of at least `HELPER_MIN_BYTES`, the enqueuer sends the helpers its blocks in
turn, each as one line of text (the file, named `/proc/<pid>/fd/<n>` after the enqueuer's own open
file so that a helper reads the bytes the enqueuer reads even if the path was swapped since; the
offset; the length), and cuts and publishes the blocks before while they parse. The answer is one
byte: every line of the block is a JSON value, or not (a blank or a malformed line), or the bytes
could not be read. A block that is not all values is walked line by line in the enqueuer, as
before, which names the bad line; one that could not be read is parsed in the enqueuer.

The helpers parse with the same `orjson` as the enqueuer and the workers, so a line is accepted
exactly as before. There are `min(MAX_HELPERS, CPUs)` per API process (`python -m
jobs.batch.line_checks`, importing nothing else), started when gunicorn has made the process
(`api/gunicorn_config.py`, `LineChecks.start`), else on the first large file, and kept; they exit
when the API process does (their input closes). Started by the first large file, they held up its
job by their start: in `bench/onnx_batch.py` (200,000 rows, 2 cores) the first job on an API
process had all its batches queued 0.17 s after its submission, the next ones 0.09-0.14 s; with
the helpers started ahead, the first took 0.09-0.12 s too. One job uses them at a time; another parses
by itself meanwhile. If one dies, the blocks it held are parsed in the enqueuer and the next large
file starts them again.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import orjson

log = logging.getLogger(__name__)

# Files smaller than this are parsed by the enqueuer alone: a small job's wait is short anyway.
HELPER_MIN_BYTES = 4 << 20
MAX_HELPERS = 4
BLOCKS_AHEAD_PER_HELPER = 2  # blocks sent to each helper ahead of the one the enqueuer cuts


def all_json_values(block: bytes) -> bool:
    """Whether every line of `block` (lines joined by newlines) is one JSON value; a blank line is not.

    Each document is dropped as soon as it is parsed (`map` drained by a zero-length deque), so
    memory stays flat."""
    try:
        deque(map(orjson.loads, block.split(b"\n")), maxlen=0)
    except orjson.JSONDecodeError:  # invalid UTF-8 included
        return False
    return True


class HelperGone(Exception):
    """The helper process died, or never answered."""


class _Helper:
    """One helper process and its pipes."""

    def __init__(self) -> None:
        # It imports this module from where this process did, whatever its folder and path.
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jobs.batch.line_checks"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            bufsize=0, close_fds=True, env=env,
        )

    def ask(self, file: str, offset: int, length: int) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"{file}\t{offset}\t{length}\n".encode())
        except OSError as e:  # BrokenPipeError: it died
            raise HelperGone(str(e)) from e

    def answer(self) -> bool | None:
        """True: every line is a JSON value; False: not; None: it could not read the block."""
        assert self.process.stdout is not None
        reply = self.process.stdout.read(1)
        if reply not in (b"0", b"1", b"?"):
            raise HelperGone(f"it answered {reply!r}")
        return None if reply == b"?" else reply == b"1"

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.kill()
        self.process.wait()


class LineChecks:
    """This process's helpers, lent to one enqueuer at a time (see the module's docstring)."""

    def __init__(self, helpers: int | None = None) -> None:
        self._lock = threading.Lock()
        self._count = helpers if helpers is not None else min(MAX_HELPERS, os.cpu_count() or 1)
        self._helpers: list[_Helper] = []
        self._pid = 0
        self._files = 0

    def start(self) -> None:
        """Start the helpers now, not on the first large file (idle, each waits on its input)."""
        if self._count > 0:
            with self._lock:
                self._running()

    @contextmanager
    def lent(self, stream: BinaryIO, size: int) -> Iterator[BlockChecks]:
        """Checks for the blocks of `stream` (a file of `size` bytes): by the helpers when the file is
        large and local and they are free, else by the caller."""
        fileno = _local_fileno(stream) if self._count > 0 and size >= HELPER_MIN_BYTES else None
        if fileno is None or not self._lock.acquire(blocking=False):
            yield BlockChecks([], "")
            return
        try:
            helpers = self._running()
            self._files += 1  # a new name for each file lent: an fd's number is used again by the next file
            checks = BlockChecks(helpers, f"{self._files}:/proc/{os.getpid()}/fd/{fileno}")
            try:
                yield checks
            finally:
                if checks.broken:
                    self._stop()
        finally:
            self._lock.release()

    def _running(self) -> list[_Helper]:
        if self._pid != os.getpid():  # forked: the parent's helpers are not this process's children
            self._helpers, self._pid = [], os.getpid()
        self._helpers = [helper for helper in self._helpers if helper.alive()]
        self._helpers += [_Helper() for _ in range(self._count - len(self._helpers))]
        return list(self._helpers)

    def _stop(self) -> None:
        helpers, self._helpers = self._helpers, []
        if self._pid == os.getpid():
            for helper in helpers:
                helper.close()


def _local_fileno(stream: BinaryIO) -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fileno = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file of this host's (a storage stream)
        return None
    return fileno if os.path.exists(f"/proc/self/fd/{fileno}") else None


class BlockChecks:
    """Whether each block of one file holds only JSON values, in order: `send` a block, then
    `answered` answers the oldest block sent. The helpers take the blocks in turn (each answers
    its own in order); without helpers, each block is parsed here."""

    def __init__(self, helpers: list[_Helper], file: str) -> None:
        self._helpers = helpers
        self._file = file
        self._sent: deque[tuple[bytes, _Helper | None]] = deque()  # each block, and the helper parsing it
        self._turn = 0
        self.broken = False

    @property
    def ahead(self) -> int:
        """How many blocks may be sent before the oldest answer is taken."""
        return BLOCKS_AHEAD_PER_HELPER * len(self._helpers)

    def send(self, block: bytes, offset: int) -> None:
        """Have `block` (bytes `offset`.. of the file) parsed."""
        helper = None
        if self._helpers:
            helper = self._helpers[self._turn % len(self._helpers)]
            self._turn += 1
            try:
                helper.ask(self._file, offset, len(block))
            except HelperGone as e:
                self._gone(e)
                helper = None
        self._sent.append((block, helper))

    def answered(self) -> bool:
        """Whether all the lines of the oldest block sent are JSON values."""
        block, helper = self._sent.popleft()
        answer = None
        if helper is not None and not self.broken:
            try:
                answer = helper.answer()
            except HelperGone as e:
                self._gone(e)
        return all_json_values(block) if answer is None else answer

    def _gone(self, error: HelperGone) -> None:
        log.warning("a helper process parsing JSON lines is gone (%s); parsing in the enqueuer", error)
        self._helpers, self.broken = [], True


LINE_CHECKS = LineChecks()
"""This process's helpers (`min(MAX_HELPERS, CPUs)`), for the enqueuer."""
HERE = LineChecks(helpers=0)
"""No helper: every block parsed by its caller."""


def _serve() -> None:
    """The helper: answer each `file<TAB>offset<TAB>length` line of stdin with one byte: `1` (every
    line of those bytes is a JSON value), `0` (not), `?` (they could not be read). `file` is a
    name for the file (`<n>:<path>`), opened on its first request and kept for the next ones."""
    opened: tuple[str, BinaryIO] | None = None
    out = sys.stdout.buffer
    for request in sys.stdin.buffer:
        file, offset, length = request.decode().rstrip("\n").split("\t")
        try:
            if opened is None or opened[0] != file:
                if opened is not None:
                    opened[1].close()
                opened = None
                opened = (file, open(file.partition(":")[2], "rb"))  # noqa: SIM115 - kept for the file's next blocks
            stream = opened[1]
            stream.seek(int(offset))
            data = stream.read(int(length))
            answer = (b"1" if all_json_values(data) else b"0") if len(data) == int(length) else b"?"
        except OSError:
            answer = b"?"
        out.write(answer)
        out.flush()


if __name__ == "__main__":
    # Ctrl-C reaches the whole process group: the helper ends when its input closes (the API process ended).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve()
