"""The log streams' contract (`foundation.log_streams.LogStreams`).

Fixtures a subclass provides: `make_streams(max_lines, retention_s)` (streams over an empty store)
and `unreachable_streams` (streams that cannot be reached).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from foundation.log_streams import BadStreamId, LogStreams, api_stream, job_stream

MakeStreams = Callable[..., LogStreams]


def lines(*numbers: int) -> list[str]:
    return [f'{{"message": "line {n}", "n": {n}}}' for n in numbers]


class LogStreamsContract:
    @pytest.fixture
    def streams(self, make_streams: MakeStreams) -> LogStreams:
        return make_streams(max_lines=10_000, retention_s=3600)

    def test_lines_are_read_back_in_order_a_page_at_a_time_and_following_from_next_gives_only_new_ones(
        self, streams: LogStreams,
    ) -> None:
        stream = job_stream("j1")
        assert streams.append({stream: lines(*range(5))}) == 5

        first = streams.read(stream, limit=2)
        second = streams.read(stream, after=first.next, limit=2)
        third = streams.read(stream, after=second.next, limit=2)
        caught_up = streams.read(stream, after=third.next)

        assert [line["n"] for page in (first, second, third) for line in page.lines] == list(range(5))
        assert len(third.lines) == 1
        assert caught_up.lines == [] and caught_up.next == third.next
        streams.append({stream: lines(5)})
        assert [line["message"] for line in streams.read(stream, after=caught_up.next).lines] == ["line 5"]

    def test_an_empty_or_missing_stream_reads_as_no_lines_from_the_start(self, streams: LogStreams) -> None:
        page = streams.read(job_stream("never-logged"))

        assert page.lines == [] and page.next == "0-0"
        assert streams.read(job_stream("never-logged"), after="1700000000000-3").next == "1700000000000-3"

    def test_lines_of_several_streams_go_each_to_its_own_in_one_append(self, streams: LogStreams) -> None:
        sent = streams.append({job_stream("a"): lines(1, 2), api_stream("iris"): lines(3), job_stream("b"): []})

        assert sent == 3
        assert [line["n"] for line in streams.read(job_stream("a")).lines] == [1, 2]
        assert [line["n"] for line in streams.read(api_stream("iris")).lines] == [3]
        assert streams.read(job_stream("b")).lines == []
        assert streams.append({}) == 0

    def test_a_page_holds_at_least_one_line_and_at_most_the_limit(self, streams: LogStreams) -> None:
        stream = job_stream("j1")
        streams.append({stream: lines(*range(3))})

        assert len(streams.read(stream, limit=0).lines) == 1
        assert len(streams.read(stream, limit=2).lines) == 2
        assert len(streams.read(stream, limit=100).lines) == 3

    def test_a_position_in_milliseconds_alone_is_a_position(self, streams: LogStreams) -> None:
        stream = job_stream("j1")
        streams.append({stream: lines(1, 2)})

        assert [line["n"] for line in streams.read(stream, after="0").lines] == [1, 2]
        assert streams.read(stream, after="99999999999999").lines == []

    def test_a_line_that_is_not_a_json_object_reads_as_its_message(self, streams: LogStreams) -> None:
        stream = job_stream("odd")
        streams.append({stream: ["plain text", "[1, 2]", '{"message": "fine"}']})

        assert streams.read(stream).lines == [{"message": "plain text"}, {"message": [1, 2]}, {"message": "fine"}]

    def test_a_stream_keeps_about_its_bound_of_newest_lines(self, make_streams: MakeStreams) -> None:
        streams = make_streams(max_lines=50, retention_s=3600)
        stream = job_stream("chatty")
        for start in range(0, 1000, 10):
            streams.append({stream: lines(*range(start, start + 10))})

        kept = streams.read(stream, limit=10_000).lines

        # Redis's `MAXLEN ~` trims whole stream nodes (100 entries each): at least the bound, at most a node more.
        assert 50 <= len(kept) <= 50 + 100
        assert [line["n"] for line in kept] == list(range(1000 - len(kept), 1000))
        assert streams.max_lines == 50

    def test_lines_superseding_a_stream_replace_what_it_held_and_followers_see_only_them(
        self, streams: LogStreams,
    ) -> None:
        stream = job_stream("flood")
        streams.append({stream: lines(0)})
        before = streams.read(stream)

        streams.append({stream: lines(*range(950, 1001))}, superseded={stream})

        assert [line["n"] for line in streams.read(stream).lines] == list(range(950, 1001))
        assert [line["n"] for line in streams.read(stream, after=before.next).lines] == list(range(950, 1001))

    def test_a_position_that_is_not_a_stream_id_is_a_bad_request(self, streams: LogStreams) -> None:
        for bad in ("yesterday", "-1", "1-2-3", str(2**64)):
            with pytest.raises(BadStreamId) as raised:
                streams.read(job_stream("j1"), after=bad)
            assert raised.value.http_status == 400 and raised.value.kind == "bad_request"

    def test_streams_that_cannot_be_reached_raise_a_connection_error(self, unreachable_streams: LogStreams) -> None:
        with pytest.raises(redis.ConnectionError):
            unreachable_streams.append({job_stream("j1"): lines(1)})
        with pytest.raises(redis.ConnectionError):
            unreachable_streams.read(job_stream("j1"))
