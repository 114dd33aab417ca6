"""The log lines of a job, of an API, and of an AsyncAPI request, gathered from every process on every host.

A worker's lines while it runs a job's batch or its `on_job_complete`, and every line of a
realtime replica's processes, are JSON lines on the process's stderr (`foundation/json_logs.py`);
a process's stderr stays on its host. So the same lines are also appended to a Redis stream, one
per job (`sluice:logs:job:<job id>`), one per realtime API or AsyncAPI (`sluice:logs:api:<name>`)
and one per AsyncAPI request that logged anything (`sluice:logs:async:<name>:<id>`), which
`sluice logs` reads through the API whichever host wrote them. A node's line while it runs AsyncAPI
requests goes to its API's stream and to the stream of each request it runs for: a batch of
requests (`server_side_batching`) is one `predict` call, whose lines cannot be told apart per
request, so each of them is in every request's stream of that batch.

- Bounded: each append trims its stream to about `Settings.log_lines` lines (`XADD MAXLEN ~`,
  which drops whole stream nodes, so a stream may hold up to a node's worth, 100 lines, more) and
  sets the stream to expire `Settings.log_retention_s` after its last line. A line over
  `MAX_STREAM_LINE_BYTES` is cut down to its first part (it stays whole on stderr).
- Never in the way: `StreamLogHandler.emit` only formats and buffers a line; a flusher thread
  ships what is buffered every `FLUSH_INTERVAL_S`, and at once when a batch ends, in one
  pipelined round trip. A Redis failure loses the lines of that flush from the stream (never
  from stderr) and is told once on the process's own log until Redis answers again; it never
  reaches the batch or the request.
- Followed by id: stream ids only grow, so a reader passes the `next` id of its last page as
  `after` and gets only newer lines.

`LogStreams` is what the handler and the API's readers type against; `RedisLogStreams` keeps the
streams in Redis, `foundation.memory.MemoryLogStreams` in memory for fast tests; both pass
`tests/contracts/log_streams.py`.

Which streams a line goes to: inside `handler.capturing(*streams)` (a worker wraps each batch and
each completion in the job's, each AsyncAPI request in its request's and its API's, a batch of
requests in all of theirs) the lines of that thread go to those streams (the innermost block's);
elsewhere, to the handler's default stream (a replica's API), or nowhere (a worker's own lines
between jobs). A
thread that a predictor starts itself does not inherit the job (nor its labels): its lines stay
on stderr.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis

from foundation import keys
from foundation.errors import BadRequest
from foundation.json_logs import MAX_LINE_BYTES, JsonLinesFormatter
from foundation.redis_clients import background_client, text

if TYPE_CHECKING:
    from foundation.settings import Settings

log = logging.getLogger(__name__)

JOB_STREAM_PREFIX = keys.JOB_LOG_PREFIX
API_STREAM_PREFIX = keys.API_LOG_PREFIX
REQUEST_STREAM_PREFIX = keys.ASYNC_LOG_PREFIX
LINE_FIELD = "line"

DEFAULT_MAX_LINES = 10_000
DEFAULT_RETENTION_S = 7 * 24 * 3600.0
# Lines one read answers by default, and at most.
DEFAULT_PAGE_LINES = 1000
MAX_PAGE_LINES = 10_000
# How often buffered lines are shipped: a long batch's lines show within about this long.
FLUSH_INTERVAL_S = 0.5
# A stream keeps each line up to this size: 10,000 lines of a predictor that logs its payloads
# must not fill Redis's memory.
MAX_STREAM_LINE_BYTES = 16 * 1024
# Log shipping gives up on a call after a short while instead of riding out a Redis stall (the
# lines are on stderr anyway: `foundation.redis_clients.BACKGROUND`); no call is ever made on a
# batch's or a request's thread.
START = "0-0"

_STREAM_ID = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?$")
_UINT64 = 2**64


def job_stream(job_id: str) -> str:
    """The stream of a batch job's lines, from every worker on every host."""
    return f"{JOB_STREAM_PREFIX}{job_id}"


def api_stream(api_name: str) -> str:
    """The stream of an API's lines: a realtime API's from every process of every replica, an
    AsyncAPI's from every node while it runs the API's requests."""
    return f"{API_STREAM_PREFIX}{api_name}"


def request_stream(api_name: str, request_id: str) -> str:
    """The stream of one AsyncAPI request's lines (the node's while it ran the request)."""
    return f"{REQUEST_STREAM_PREFIX}{api_name}:{request_id}"


class BadStreamId(BadRequest):
    """An `after` that is not a stream id as a page's `next` gives them (`<milliseconds>-<sequence>`)."""


def parse_stream_id(text: str) -> str:
    """`text` as a stream id Redis accepts, or BadStreamId."""
    match = _STREAM_ID.match(text.strip())
    if match is None or int(match.group(1)) >= _UINT64 or int(match.group(2) or 0) >= _UINT64:
        raise BadStreamId(
            f"after must be a log position as `next` gives it, such as 1700000000000-0 (got {text[:40]!r})"
        )
    return match.group(0)


@dataclass(frozen=True)
class LogPage:
    """Lines in the order they were shipped, and the position to read on from (`after=next`)."""

    lines: list[dict[str, Any]]
    next: str

    def to_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "next": self.next}


def stream_id_key(stream_id: str) -> tuple[int, int]:
    """A stream id as a pair that sorts as Redis orders ids (a missing sequence is 0)."""
    milliseconds, _, sequence = stream_id.partition("-")
    return int(milliseconds), int(sequence or 0)


def parse_line(raw: bytes | str) -> dict[str, Any]:
    """A stored line as the reader gets it: its JSON object, or {"message": text} for anything else."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        line = json.loads(text)
    except ValueError:
        return {"message": text}
    return line if isinstance(line, dict) else {"message": line}


class LogStreams(Protocol):
    """Log streams: lines appended within their bounds, read back a page at a time.

    Streams that cannot be reached raise `redis.RedisError` (a `redis.ConnectionError` when they
    cannot be reached at all).
    """

    @property
    def max_lines(self) -> int:
        """About how many of its newest lines a stream keeps (at least this many)."""
        ...

    def append(self, lines_by_stream: Mapping[str, Iterable[str]], superseded: Collection[str] = ()) -> int:
        """Append lines to their streams in one round trip; how many were sent.

        `superseded` names streams whose lines given here are already the newest `max_lines` of
        more that were logged: what the stream holds is emptied first (its ids still grow), so
        it keeps the newest lines without a gap before them.
        """
        ...

    def read(self, stream: str, after: str | None = None, limit: int = DEFAULT_PAGE_LINES) -> LogPage:
        """Up to `limit` lines after the position `after` (from the oldest kept line without it);
        `BadStreamId` for an `after` that is not a position."""
        ...


def clamp_limit(limit: int) -> int:
    """A page's size as asked, within 1 and MAX_PAGE_LINES."""
    return min(max(int(limit), 1), MAX_PAGE_LINES)


class RedisLogStreams(LogStreams):
    """`LogStreams` in Redis streams (`XADD MAXLEN ~`, `EXPIRE`, `XREAD`); the client is passed in."""

    def __init__(
        self, client: redis.Redis, max_lines: int = DEFAULT_MAX_LINES, retention_s: float = DEFAULT_RETENTION_S,
    ) -> None:
        self._redis = client
        self._max_lines = max(int(max_lines), 1)
        self.retention_s = max(int(retention_s), 1)

    @property
    def max_lines(self) -> int:
        return self._max_lines

    @classmethod
    def for_shipping(cls, settings: Settings) -> RedisLogStreams:
        """A background client of its own that fails fast: a stalled Redis must not hold the
        flusher for long, and the next flush is the retry."""
        return cls(background_client(settings), settings.log_lines, settings.log_retention_s)

    def append(self, lines_by_stream: Mapping[str, Iterable[str]], superseded: Collection[str] = ()) -> int:
        pipe = self._redis.pipeline(transaction=False)
        sent = 0
        for stream, lines in lines_by_stream.items():
            if stream in superseded:
                pipe.xtrim(stream, maxlen=0, approximate=False)
            count = 0
            for line in lines:
                pipe.xadd(stream, {LINE_FIELD: line}, maxlen=self.max_lines, approximate=True)
                count += 1
            if count:
                pipe.expire(stream, self.retention_s)
                sent += count
        if sent:
            pipe.execute()
        return sent

    def read(self, stream: str, after: str | None = None, limit: int = DEFAULT_PAGE_LINES) -> LogPage:
        cursor = parse_stream_id(after) if after else START
        answer: Any = self._redis.xread({stream: cursor}, count=clamp_limit(limit))
        # [[stream, [(id, {field: value}), ...]]] (RESP2); nothing when the stream has no newer line
        entries: list[tuple[bytes, dict[bytes, bytes]]] = answer[0][1] if answer else []
        if not entries:
            return LogPage([], cursor)
        lines = [parse_line(fields.get(LINE_FIELD.encode(), b"")) for _, fields in entries]
        last = entries[-1][0]
        return LogPage(lines, text(last))


def bounded_line(line: str) -> str | None:
    """The line as a stream keeps it: whole up to MAX_STREAM_LINE_BYTES, else its Sluice keys with
    the message cut short (a line over MAX_LINE_BYTES is dropped, as on stderr)."""
    size = len(line.encode("utf-8", "replace"))
    if size <= MAX_STREAM_LINE_BYTES:
        return line
    if size > MAX_LINE_BYTES:
        return None
    try:
        whole = json.loads(line)
    except ValueError:
        return None
    cut = {key: whole[key] for key in ("asctime", "levelname", "process", "labels") if key in whole}
    message = str(whole.get("message", ""))
    cut["message"] = message[: MAX_STREAM_LINE_BYTES // 4]
    cut["truncated_from_bytes"] = size
    return json.dumps(cut, default=str)


_capturing: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("sluice_log_streams", default=())


class StreamLogHandler(logging.Handler):
    """Buffers JSON lines for log streams and ships them from a thread of its own.

    Install one on the root logger of a process (`install`). The flusher thread starts with the
    first line, and again in a forked child (which inherits the buffer but not the thread).
    """

    def __init__(
        self, streams: LogStreams, default_stream: str | None = None, flush_interval_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        super().__init__()
        self.setFormatter(JsonLinesFormatter())
        self.streams = streams
        self.default_stream = default_stream
        self.flush_interval_s = flush_interval_s
        self._reset_for_process()

    def _reset_for_process(self) -> None:
        self._pid = os.getpid()
        self._buffer: dict[str, deque[str]] = {}
        self._overflowed: set[str] = set()  # streams of which more than a stream's bound is buffered
        self._buffer_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    @contextlib.contextmanager
    def capturing(self, *streams: str) -> Iterator[None]:
        """The lines this thread logs inside the block go to `streams` (in place of an enclosing
        block's: a block about one request inside a batch's is that request's alone); shipped as soon
        as it ends."""
        token = _capturing.set(tuple(dict.fromkeys(streams)))
        try:
            yield
        finally:
            _capturing.reset(token)
            if self._buffer:  # the flusher ships them now, off this thread (not woken for a block that logged
                self._wake.set()  # nothing: most batches, whose wake-up cost a thread switch each)

    def capturing_job(self, job_id: str) -> contextlib.AbstractContextManager[None]:
        """`capturing` the job's stream (around a batch, or the job's completion)."""
        return self.capturing(job_stream(job_id))

    def capturing_request(self, api_name: str, request_id: str) -> contextlib.AbstractContextManager[None]:
        """`capturing` an AsyncAPI request's stream and its API's (around the node's run of it)."""
        return self.capturing_requests(api_name, [request_id])

    def capturing_requests(self, api_name: str, request_ids: Sequence[str]) -> contextlib.AbstractContextManager[None]:
        """`capturing` the API's stream and each request's (around a batch of them: one `predict`
        call's lines are every request's of the batch); with no request, the API's alone."""
        return self.capturing(*(request_stream(api_name, r) for r in request_ids), api_stream(api_name))

    def emit(self, record: logging.LogRecord) -> None:
        streams = _capturing.get() or ((self.default_stream,) if self.default_stream is not None else ())
        if not streams or record.name == log.name:  # this module's own warnings stay local
            return
        try:
            line = bounded_line(self.format(record))
            if line is None:
                return
            if os.getpid() != self._pid:  # a forked child: its parent's buffer and thread are not its own
                self._reset_for_process()
            with self._buffer_lock:
                for stream in streams:
                    lines = self._buffer.get(stream)
                    if lines is None:
                        lines = self._buffer[stream] = deque(maxlen=self.streams.max_lines)
                    elif len(lines) == lines.maxlen:
                        self._overflowed.add(stream)
                    lines.append(line)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="sluice-log-shipper", daemon=True)
                    self._thread.start()
        except Exception:  # noqa: BLE001 - logging's own rule: a handler reports its failure, never raises it
            self.handleError(record)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Ship every buffered line now (one round trip); a failure is told once, never raised."""
        with self._send_lock:
            with self._buffer_lock:
                pending, self._buffer = self._buffer, {}
                overflowed, self._overflowed = self._overflowed, set()
            if not pending:
                return
            try:
                self.streams.append(pending, superseded=overflowed)
            except Exception as e:  # noqa: BLE001
                # Redis away or refusing (or any other failure): the lines are on stderr all the same.
                if not self._failing:
                    self._failing = True
                    log.warning("log lines could not be written to Redis (%s: %s); `sluice logs` misses the lines "
                                "of this process until Redis answers again", type(e).__name__, e)
                return
            if self._failing:
                self._failing = False
                log.warning("log lines reach Redis again")

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        try:
            self.flush()
        finally:
            super().close()


def install(handler: StreamLogHandler, logger: logging.Logger | None = None) -> StreamLogHandler:
    """Put `handler` on the root logger (or `logger`) in place of any StreamLogHandler already there."""
    target = logger or logging.getLogger()
    for old in [h for h in target.handlers if isinstance(h, StreamLogHandler)]:
        target.removeHandler(old)
        old.close()
    target.addHandler(handler)
    return handler


def install_job_log_handler(settings: Settings, streams: LogStreams | None = None) -> StreamLogHandler:
    """A worker process's handler: lines go to a job's stream only inside `capturing_job`
    (to `streams`; by default the deployment's Redis through a client of the handler's own)."""
    return install(StreamLogHandler(streams or RedisLogStreams.for_shipping(settings)))


def install_api_log_handler(settings: Settings, api_name: str, streams: LogStreams | None = None) -> StreamLogHandler:
    """A realtime replica process's handler: every line goes to its API's stream."""
    return install(StreamLogHandler(streams or RedisLogStreams.for_shipping(settings),
                                    default_stream=api_stream(api_name)))


__all__ = [
    "API_STREAM_PREFIX",
    "JOB_STREAM_PREFIX",
    "BadStreamId",
    "LogPage",
    "LogStreams",
    "RedisLogStreams",
    "StreamLogHandler",
    "api_stream",
    "install",
    "install_api_log_handler",
    "install_job_log_handler",
    "job_stream",
    "parse_stream_id",
    "request_stream",
]
