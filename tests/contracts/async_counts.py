"""The request store's counts (`jobs.asyncapi.store.AsyncRequestStore.counts`): queued, in progress and
ended per minute, moved exactly once per move of a request.

A subclass provides the fixture `requests` (an empty store, retention 600 s). Run against the
in-memory store in tests/unit/test_async_counts.py, and against Redis's in
tests/integration/test_async_operating.py (which checks the figures the Redis one counts too).
"""

from __future__ import annotations

from jobs.asyncapi.counts import SLOT_S, AsyncCounts
from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus
from jobs.asyncapi.store import AsyncRequestStore

API = "counted"


def queued(request_id: str, created: float) -> AsyncRequest:
    return AsyncRequest(API, request_id, RequestStatus.IN_QUEUE, PayloadKind.JSON, created, payload=b"{}")


def move_four_requests(requests: AsyncRequestStore) -> None:
    """r0 completes at 1003 (delivered twice), r1 fails at 1000.5, r2 fails unrun at 1004, r3 expires queued."""
    for n in range(4):
        assert requests.create(queued(f"r{n}", 1000.0), now=1000.0)
    assert not requests.create(queued("r0", 1000.0), now=1000.0)  # a duplicate id counts nothing
    assert requests.counts(API, 1000.0) == AsyncCounts(in_queue=4)

    requests.begin(API, "r0", now=1001.0)
    requests.begin(API, "r0", now=1001.5)  # delivered again: still one in progress
    requests.begin(API, "r1", now=1001.0)
    assert requests.counts(API, 1001.5) == AsyncCounts(in_queue=2, in_progress=2)

    assert requests.finish(API, "r0", RequestStatus.COMPLETED, now=1003.0)
    assert not requests.finish(API, "r0", RequestStatus.FAILED, now=1003.5)  # ended already: nothing moves
    assert requests.finish(API, "r1", RequestStatus.FAILED, now=1000.5, message="boom")
    assert requests.finish(API, "r2", RequestStatus.FAILED, now=1004.0, message="queueing failed")  # never taken
    requests.remove(API, "r3")  # expired while queued
    requests.remove(API, "r0")  # ended: its counts moved already


class AsyncCountsContract:
    def test_each_move_of_a_request_moves_its_apis_counts_once(self, requests: AsyncRequestStore) -> None:
        move_four_requests(requests)
        assert requests.counts(API, 1004.0) == AsyncCounts()  # the current slot is not in the window yet
        assert requests.counts(API, 1004.0 + SLOT_S) == AsyncCounts(completed_per_minute=1, failed_per_minute=2)
        assert requests.counts(API, 1004.0 + 8 * SLOT_S) == AsyncCounts()  # out of the window
        assert requests.counts("another", 1004.0 + SLOT_S) == AsyncCounts()

    def test_requests_claimed_into_a_batch_are_counted_in_progress_once(self, requests: AsyncRequestStore) -> None:
        for n in range(3):
            assert requests.create(queued(f"b{n}", 1000.0), now=1000.0)
            requests.queue(API, f"b{n}")
        requests.begin(API, "b0", now=1001.0, owner="task-1")  # the delivery that gathers the batch
        claimed = requests.claim(API, "task-1", limit=2, now=1001.0)
        assert {request_id for request_id, _ in claimed} == {"b1", "b2"}
        assert requests.counts(API, 1001.0) == AsyncCounts(in_progress=3)
        assert requests.reclaim(API, "task-1", now=1002.0)  # taken again after a kill: still in progress
        assert requests.counts(API, 1002.0) == AsyncCounts(in_progress=3)
        for n in range(3):
            assert requests.finish(API, f"b{n}", RequestStatus.COMPLETED, now=1003.0)
        assert requests.counts(API, 1003.0) == AsyncCounts()
