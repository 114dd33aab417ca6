"""Log streams on a real Redis: what a worker or a replica ships, how long it is kept, how it is read back."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from foundation.log_streams import (
    MAX_STREAM_LINE_BYTES, BadStreamId, LogStreams, StreamLogHandler, api_stream, job_stream, parse_stream_id,
)
from foundation.json_logs import labelled
from sluice.embedded import free_port

WAIT_S = 30.0
NEVER_S = 3600.0  # a flush interval no test outlives: only an explicit flush (or a batch's end) ships


@pytest.fixture
def streams(redis_client: redis.Redis) -> LogStreams:
    return LogStreams(redis_client, max_lines=10_000, retention_s=3600)


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


def wait_for_lines(streams: LogStreams, stream: str, count: int) -> list[dict]:
    deadline = time.monotonic() + WAIT_S
    while True:
        lines = streams.read(stream).lines
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def commands_processed(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


def test_lines_are_read_back_in_order_a_page_at_a_time_and_following_from_next_gives_only_new_ones(streams):
    stream = job_stream("j1")
    streams.append({stream: [f'{{"message": "line {n}"}}' for n in range(5)]})

    first = streams.read(stream, limit=2)
    second = streams.read(stream, after=first.next, limit=2)
    third = streams.read(stream, after=second.next, limit=2)
    caught_up = streams.read(stream, after=third.next)

    assert [line["message"] for page in (first, second, third) for line in page.lines] == [f"line {n}" for n in range(5)]
    assert len(third.lines) == 1
    assert caught_up.lines == [] and caught_up.next == third.next
    streams.append({stream: ['{"message": "line 5"}']})
    assert [line["message"] for line in streams.read(stream, after=caught_up.next).lines] == ["line 5"]


def test_an_empty_or_missing_stream_reads_as_no_lines_from_the_start(streams):
    page = streams.read(job_stream("never-logged"))

    assert page.lines == [] and page.next == "0-0"


def test_a_stream_keeps_about_its_bound_of_newest_lines(redis_client):
    streams = LogStreams(redis_client, max_lines=50, retention_s=3600)
    stream = job_stream("chatty")
    for start in range(0, 1000, 10):
        streams.append({stream: [f'{{"n": {n}}}' for n in range(start, start + 10)]})

    kept = streams.read(stream, limit=10_000).lines

    # `MAXLEN ~` trims whole stream nodes (100 entries each): at least the bound, at most a node more.
    assert 50 <= len(kept) <= 50 + 100
    assert [line["n"] for line in kept] == list(range(1000 - len(kept), 1000))


def test_a_stream_expires_its_retention_after_its_last_line(redis_client):
    streams = LogStreams(redis_client, max_lines=100, retention_s=120)
    stream = api_stream("iris")

    streams.append({stream: ['{"message": "hello"}']})

    assert 0 < redis_client.ttl(stream) <= 120


def test_a_position_that_is_not_a_stream_id_is_a_bad_request(streams):
    assert parse_stream_id("1700000000000-3") == "1700000000000-3"
    assert parse_stream_id("1700000000000") == "1700000000000"
    for bad in ("abc", "-1", "1-2-3", "1" * 21, str(2**64), f"1-{2**64}", ""):
        with pytest.raises(BadStreamId) as raised:
            parse_stream_id(bad)
        assert raised.value.http_status == 400 and raised.value.kind == "bad_request"
    with pytest.raises(BadStreamId):
        streams.read(job_stream("j1"), after="yesterday")


def test_a_workers_lines_inside_a_job_go_to_that_jobs_stream_with_the_jobs_labels(streams, logger):
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    logger.info("between jobs: stays on this host")
    with labelled(job_id="job-a", batch_index="3"), handler.capturing_job("job-a"):
        logger.info("predicting", extra={"rows": 12})
        logger.warning("a slow batch")
    with labelled(job_id="job-b"), handler.capturing_job("job-b"):
        logger.info("on_job_complete ran")
    handler.flush()

    a_lines = streams.read(job_stream("job-a")).lines
    assert [(line["levelname"], line["message"]) for line in a_lines] == [("INFO", "predicting"), ("WARNING", "a slow batch")]
    assert a_lines[0]["labels"] == {"job_id": "job-a", "batch_index": "3"} and a_lines[0]["rows"] == 12
    assert [line["message"] for line in streams.read(job_stream("job-b")).lines] == ["on_job_complete ran"]


def test_logging_makes_no_redis_call_until_the_lines_are_flushed_in_one_go(redis_client, streams, logger):
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))
    before = commands_processed(redis_client)

    with handler.capturing(job_stream("busy")):
        for n in range(200):
            logger.info("line %d", n)
        during = commands_processed(redis_client)
        handler.flush()

    assert during - before == 1  # the INFO call that counted them
    assert len(streams.read(job_stream("busy")).lines) == 200


def test_a_long_batchs_lines_show_up_while_it_still_runs(streams, logger):
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=0.2))

    with handler.capturing_job("long"):
        logger.info("still working")
        lines = wait_for_lines(streams, job_stream("long"), 1)  # nobody flushes: the shipper thread does

    assert [line["message"] for line in lines] == ["still working"]


def test_the_end_of_a_batch_ships_its_lines_without_waiting_for_the_interval(streams, logger):
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    with handler.capturing_job("quick"):
        logger.info("done")

    assert [line["message"] for line in wait_for_lines(streams, job_stream("quick"), 1)] == ["done"]


def test_a_replicas_handler_sends_every_line_to_its_apis_stream(streams, logger):
    handler = attach(logger, StreamLogHandler(streams, default_stream=api_stream("iris"), flush_interval_s=NEVER_S))

    with labelled(api="iris", request_id="r-1"):
        logger.error("predict raised ValueError")
    logger.info("predictor built; this process is ready")
    handler.flush()

    lines = streams.read(api_stream("iris")).lines
    assert [line["message"] for line in lines] == ["predict raised ValueError", "predictor built; this process is ready"]
    assert lines[0]["labels"] == {"api": "iris", "request_id": "r-1"}


def test_an_oversized_line_is_cut_down_in_the_stream(streams, logger):
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))

    with handler.capturing_job("big"):
        logger.info("x" * (MAX_STREAM_LINE_BYTES * 4), extra={"payload": "y" * 1000})
    handler.flush()

    [line] = streams.read(job_stream("big")).lines
    assert line["truncated_from_bytes"] > MAX_STREAM_LINE_BYTES * 4
    assert line["message"] == "x" * (MAX_STREAM_LINE_BYTES // 4) and "payload" not in line


def test_redis_failing_never_reaches_the_caller_and_is_told_once_until_it_answers_again(
    redis_client, logger, caplog: pytest.LogCaptureFixture,
):
    nowhere = redis.Redis(port=free_port(), socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0))
    dead = LogStreams(nowhere, max_lines=100)
    handler = attach(logger, StreamLogHandler(dead, flush_interval_s=NEVER_S))
    caplog.set_level(logging.WARNING, logger="foundation.log_streams")

    for attempt in range(3):
        with handler.capturing_job("unlucky"):
            logger.info("lost from the stream %d", attempt)
        handler.flush()

    told = [r.getMessage() for r in caplog.records if r.name == "foundation.log_streams"]
    assert len(told) == 1 and "could not be written to Redis" in told[0]
    handler.streams = LogStreams(redis_client)
    with handler.capturing_job("lucky"):
        logger.info("shipped")
    handler.flush()
    told = [r.getMessage() for r in caplog.records if r.name == "foundation.log_streams"]
    assert told[1:] == ["log lines reach Redis again"]
    assert [line["message"] for line in handler.streams.read(job_stream("lucky")).lines] == ["shipped"]


def test_the_bound_and_retention_are_the_deployments_settings(redis_server):
    from foundation.settings import Settings

    settings = Settings.from_env({"SLUICE_REDIS_URL": redis_server, "SLUICE_LOG_LINES": "500",
                                  "SLUICE_LOG_RETENTION_S": "60"})

    streams = LogStreams.for_shipping(settings)

    assert (settings.log_lines, settings.log_retention_s) == (500, 60.0)
    assert (streams.max_lines, streams.retention_s) == (500, 60)
    assert (Settings().log_lines, Settings().log_retention_s) == (10_000, 7 * 24 * 3600.0)


def test_more_lines_between_two_flushes_than_a_stream_keeps_leave_its_newest_lines_without_a_gap(redis_client, logger):
    streams = LogStreams(redis_client, max_lines=50, retention_s=3600)
    handler = attach(logger, StreamLogHandler(streams, flush_interval_s=NEVER_S))
    with handler.capturing_job("flood"):
        logger.info("an older line")
        handler.flush()
        for n in range(1000):
            logger.info("line", extra={"n": n})
        handler.flush()
        logger.info("line", extra={"n": 1000})
        handler.flush()

    kept = streams.read(job_stream("flood")).lines

    assert [line["n"] for line in kept] == list(range(1000 - 50, 1001))
