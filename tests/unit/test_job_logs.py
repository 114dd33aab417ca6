"""Log shipping: what a worker or a replica ships to its log streams, when, and what a failure does.

The handler runs against the in-memory streams (`foundation.memory.MemoryLogStreams`); the
streams' own contract (pages, bounds, positions) is `tests/contracts/log_streams.py`, run against
the fake here and against Redis in tests/integration/test_foundation_redis.py.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest

from foundation.json_logs import labelled
from foundation.log_streams import (
    MAX_STREAM_LINE_BYTES,
    BadStreamId,
    RedisLogStreams,
    StreamLogHandler,
    api_stream,
    install_api_log_handler,
    install_job_log_handler,
    job_stream,
    parse_stream_id,
    request_stream,
)
from foundation.memory import MemoryLogStreams
from foundation.redis_clients import BACKGROUND
from foundation.settings import Settings

WAIT_S = 30.0
NEVER_S = 3600.0  # a flush interval no test outlives: only an explicit flush (or a batch's end) ships


@pytest.fixture
def streams() -> MemoryLogStreams:
    return MemoryLogStreams(max_lines=10_000, retention_s=3600)


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    """A logger of the test's own (not the root's), as a worker's root logger would be."""
    private = logging.getLogger(f"test.job_logs.{uuid.uuid4().hex}")
    private.propagate = False
    private.setLevel(logging.DEBUG)
    yield private
    for handler in list(private.handlers):
        private.removeHandler(handler)
        handler.close()


def attach(logger: logging.Logger, handler: StreamLogHandler) -> StreamLogHandler:
    logger.addHandler(handler)
    return handler


def test_a_position_that_is_not_a_stream_id_is_a_bad_request() -> None:
    assert parse_stream_id("1700000000000-3") == "1700000000000-3"
    assert parse_stream_id("1700000000000") == "1700000000000"
    assert parse_stream_id(" 5-1 ") == "5-1"
    for bad in ("abc", "-1", "1-2-3", "1" * 21, str(2**64), f"1-{2**64}", ""):
        with pytest.raises(BadStreamId) as raised:
            parse_stream_id(bad)
        assert raised.value.http_status == 400 and raised.value.kind == "bad_request"


def test_a_workers_lines_inside_a_job_go_to_that_jobs_stream_with_the_jobs_labels(
    streams: MemoryLogStreams, logger: logging.Logger,
) -> None:
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    logger.info("between jobs: stays on this host")
    with labelled(job_id="job-a", batch_index="3"), handler.capturing_job("job-a"):
        logger.info("predicting", extra={"rows": 12})
        logger.warning("a slow batch")
    with labelled(job_id="job-b"), handler.capturing_job("job-b"):
        logger.info("on_job_complete ran")
    handler.flush()

    a_lines = streams.read(job_stream("job-a")).lines
    assert [(line["levelname"], line["message"]) for line in a_lines] == [
        ("INFO", "predicting"), ("WARNING", "a slow batch")]
    assert a_lines[0]["labels"] == {"job_id": "job-a", "batch_index": "3"} and a_lines[0]["rows"] == 12
    assert [line["message"] for line in streams.read(job_stream("job-b")).lines] == ["on_job_complete ran"]


def test_a_nodes_lines_for_an_async_request_go_to_the_requests_stream_and_its_apis(
    streams: MemoryLogStreams, logger: logging.Logger,
) -> None:
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    with handler.capturing_request("echo", "r1"):
        logger.info("running r1")
        with handler.capturing_requests("echo", ["r1", "r2"]):  # r1's delivery gathered r2 into its batch
            logger.info("predicting both")
    with handler.capturing_request("other", "r9"):
        logger.info("another api's request")
    handler.flush()

    def messages(stream: str) -> list[str]:
        return [line["message"] for line in streams.read(stream).lines]

    assert messages(request_stream("echo", "r1")) == ["running r1", "predicting both"]
    assert messages(request_stream("echo", "r2")) == ["predicting both"]
    assert messages(api_stream("echo")) == ["running r1", "predicting both"]  # each line once, in order
    assert messages(api_stream("other")) == ["another api's request"]


def test_logging_calls_the_streams_not_once_until_the_lines_are_flushed_in_one_go(
    streams: MemoryLogStreams, logger: logging.Logger,
) -> None:
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    with handler.capturing(job_stream("busy")):
        for n in range(200):
            logger.info("line %d", n)
        during = streams.appends
        handler.flush()

    assert during == 0 and streams.appends == 1
    assert len(streams.read(job_stream("busy")).lines) == 200


def test_a_long_batchs_lines_show_up_while_it_still_runs(streams: MemoryLogStreams, logger: logging.Logger) -> None:
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=0.2))

    with handler.capturing_job("long"):
        logger.info("still working")
        lines = streams.wait_for_lines(job_stream("long"), 1, WAIT_S)  # nobody flushes: the shipper thread does

    assert [line["message"] for line in lines] == ["still working"]


def test_the_end_of_a_batch_ships_its_lines_without_waiting_for_the_interval(
    streams: MemoryLogStreams, logger: logging.Logger,
) -> None:
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    with handler.capturing_job("quick"):
        logger.info("done")

    assert [line["message"] for line in streams.wait_for_lines(job_stream("quick"), 1, WAIT_S)] == ["done"]


def test_a_replicas_handler_sends_every_line_to_its_apis_stream(
    streams: MemoryLogStreams, logger: logging.Logger,
) -> None:
    handler = attach(logger, StreamLogHandler(streams, default_stream=api_stream("iris"), flush_interval_s=NEVER_S))

    with labelled(api="iris", request_id="r-1"):
        logger.error("predict raised ValueError")
    logger.info("predictor built; this process is ready")
    handler.flush()

    lines = streams.read(api_stream("iris")).lines
    assert [line["message"] for line in lines] == [
        "predict raised ValueError", "predictor built; this process is ready"]
    assert lines[0]["labels"] == {"api": "iris", "request_id": "r-1"}


def test_an_oversized_line_is_cut_down_in_the_stream(streams: MemoryLogStreams, logger: logging.Logger) -> None:
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    with handler.capturing_job("big"):
        logger.info("x" * (MAX_STREAM_LINE_BYTES * 4), extra={"payload": "y" * 1000})
    handler.flush()

    [line] = streams.read(job_stream("big")).lines
    assert line["truncated_from_bytes"] > MAX_STREAM_LINE_BYTES * 4
    assert line["message"] == "x" * (MAX_STREAM_LINE_BYTES // 4) and "payload" not in line


def test_redis_failing_never_reaches_the_caller_and_is_told_once_until_it_answers_again(
    streams: MemoryLogStreams, logger: logging.Logger, caplog: pytest.LogCaptureFixture,
) -> None:
    streams.unreachable = True
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))
    caplog.set_level(logging.WARNING, logger="foundation.log_streams")

    for attempt in range(3):
        with handler.capturing_job("unlucky"):
            logger.info("lost from the stream %d", attempt)
        handler.flush()

    told = [r.getMessage() for r in caplog.records if r.name == "foundation.log_streams"]
    assert len(told) == 1 and "could not be written to Redis" in told[0]
    streams.unreachable = False
    with handler.capturing_job("lucky"):
        logger.info("shipped")
    handler.flush()
    told = [r.getMessage() for r in caplog.records if r.name == "foundation.log_streams"]
    assert told[1:] == ["log lines reach Redis again"]
    assert [line["message"] for line in streams.read(job_stream("lucky")).lines] == ["shipped"]
    assert streams.read(job_stream("unlucky")).lines == []  # lost from the stream (they stayed on stderr)


def test_more_lines_between_two_flushes_than_a_stream_keeps_leave_its_newest_lines_without_a_gap(
    logger: logging.Logger,
) -> None:
    streams = MemoryLogStreams(max_lines=50, retention_s=3600)
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))
    with handler.capturing_job("flood"):
        logger.info("an older line")
        handler.flush()
        for n in range(1000):
            logger.info("line", extra={"n": n})
        handler.flush()
        logger.info("line", extra={"n": 1000})
        handler.flush()

    kept = [line.get("n") for line in streams.read(job_stream("flood")).lines]

    # The stream keeps at least its bound (Redis about a node more: tests/integration/test_foundation_redis.py).
    assert len(kept) >= 50 and kept == list(range(1001 - len(kept), 1001))


def test_the_bound_and_retention_are_the_deployments_settings() -> None:
    settings = Settings.from_env({"SLUICE_REDIS_URL": "redis://10.0.0.9:6380/2", "SLUICE_LOG_LINES": "500",
                                  "SLUICE_LOG_RETENTION_S": "60"})

    streams = RedisLogStreams.for_shipping(settings)  # builds a client; nothing connects until a flush

    assert (settings.log_lines, settings.log_retention_s) == (500, 60.0)
    assert (streams.max_lines, streams.retention_s) == (500, 60)
    assert (Settings().log_lines, Settings().log_retention_s) == (10_000, 7 * 24 * 3600.0)
    options = streams._redis.connection_pool.connection_kwargs
    assert (options["host"], options["port"], options["db"]) == ("10.0.0.9", 6380, 2)
    assert options["socket_timeout"] == BACKGROUND.socket_timeout_s  # a stalled Redis holds the flusher briefly


def test_a_process_handler_ships_to_the_streams_it_is_given(streams: MemoryLogStreams) -> None:
    settings = Settings()
    try:
        worker = install_job_log_handler(settings, streams)
        assert worker.streams is streams and worker.default_stream is None
        replica = install_api_log_handler(settings, "iris", streams)
        assert replica.streams is streams and replica.default_stream == api_stream("iris")
        assert [h for h in logging.getLogger().handlers if isinstance(h, StreamLogHandler)] == [replica]
    finally:
        for handler in [h for h in logging.getLogger().handlers if isinstance(h, StreamLogHandler)]:
            logging.getLogger().removeHandler(handler)
            handler.close()


def test_a_batch_that_logs_nothing_does_not_wake_the_shipper(
    streams: MemoryLogStreams, logger: logging.Logger, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipper thread runs once a line was logged; waking it at the end of every batch, with nothing
    to ship, cost a node a thread switch per batch."""
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))
    with handler.capturing_job("first"):
        logger.info("the shipper thread starts with a first line")
    streams.wait_for_lines(job_stream("first"), 1, WAIT_S)
    shipped = threading.Event()
    ship = handler.flush
    monkeypatch.setattr(handler, "flush", lambda: (shipped.set(), ship())[1])

    for _ in range(20):
        with handler.capturing_job("quiet"):
            pass
    woken_by_quiet_batches = shipped.wait(0.3)  # time enough for a woken shipper to run
    with handler.capturing_job("loud"):
        logger.info("a line")

    assert [line["message"] for line in streams.wait_for_lines(job_stream("loud"), 1, WAIT_S)] == ["a line"]
    assert not woken_by_quiet_batches
