"""The AsyncAPI request store's contract (`jobs.asyncapi.store.AsyncRequestStore`): records stored once,
taken by one delivery at a time, claimed into batches, ended exactly once, expired after retention.

Fixtures a subclass provides: `requests` (empty, with a retention of `RETENTION_S`) and `nodes` (a
`jobs.nodes.registry.NodeRegistry` reading the in-flight hashes `requests` writes). Run against the
in-memory store in tests/unit/test_async_store_contract.py, and against Redis's and the in-memory one
in tests/integration/test_async_store_redis.py.
"""

from __future__ import annotations

from jobs.asyncapi.request import AsyncRequest, PayloadKind, RequestStatus
from jobs.asyncapi.store import AsyncRequestStore, Outcome
from jobs.nodes.registry import NodeRegistry
from jobs.transport.delivery import Delivery, request_entry
from jobs.transport.task_messages import QueuedMessage

T0 = 1_700_000_000.0
RETENTION_S = 60.0


def request(request_id: str, payload: bytes | None = b'{"n": 1}', kind: PayloadKind = PayloadKind.JSON,
            payload_uri: str = "") -> AsyncRequest:
    return AsyncRequest("echo", request_id, RequestStatus.IN_QUEUE, kind, T0, payload=payload, payload_uri=payload_uri)


def queued(requests: AsyncRequestStore, *request_ids: str) -> None:
    for request_id in request_ids:
        assert requests.create(request(request_id), T0)
        requests.queue("echo", request_id)


class AsyncRequestStoreContract:
    # -- storing --------------------------------------------------------------------------------
    def test_a_request_is_stored_once_and_read_back_as_it_was(self, requests: AsyncRequestStore) -> None:
        first = request("r1", payload=b"\x00\x01 bytes", kind=PayloadKind.BYTES)
        assert requests.create(first, T0)
        assert not requests.create(request("r1", payload=b"other"), T0 + 1)  # the same id: nothing changes
        assert requests.get("echo", "r1") == first
        assert requests.get("echo", "r2") is None and requests.get("other-api", "r1") is None

    def test_a_large_payloads_place_is_kept_instead_of_the_payload(self, requests: AsyncRequestStore) -> None:
        stored = request("r1", payload=None, payload_uri="s3://bucket/async/echo/r1/payload")
        requests.create(stored, T0)
        assert requests.get("echo", "r1") == stored

    # -- taking ---------------------------------------------------------------------------------
    def test_a_delivery_takes_a_request_and_only_its_own_next_delivery_takes_it_again(
            self, requests: AsyncRequestStore) -> None:
        requests.create(request("r1"), T0)
        taken = requests.begin("echo", "r1", T0 + 1, owner="task-1")
        assert (taken.status, taken.deliveries, taken.runs) == (RequestStatus.IN_QUEUE, 1, True)
        assert requests.get("echo", "r1").status is RequestStatus.IN_PROGRESS  # type: ignore[union-attr]
        other = requests.begin("echo", "r1", T0 + 2, owner="task-2")  # held by task-1: left alone
        assert other.held and not other.runs
        again = requests.begin("echo", "r1", T0 + 3, owner="task-1")  # task-1's message came back: its node died
        assert (again.status, again.deliveries, again.runs) == (RequestStatus.IN_PROGRESS, 2, True)
        assert requests.get("echo", "r1").deliveries == 2  # type: ignore[union-attr]

    def test_a_delivery_that_takes_a_request_gets_its_record_as_taken(self, requests: AsyncRequestStore) -> None:
        requests.create(request("r1", payload=b'{"n": 7}'), T0)
        taken = requests.begin("echo", "r1", T0 + 1, owner="task-1")
        assert taken.request is not None and taken.request == requests.get("echo", "r1")
        assert (taken.request.payload, taken.request.status, taken.request.deliveries) == (
            b'{"n": 7}', RequestStatus.IN_PROGRESS, 1)
        assert requests.begin("echo", "r1", T0 + 2, owner="task-2").request is None  # held: not handed over

    def test_many_records_are_read_at_once_leaving_out_unknown_ones(self, requests: AsyncRequestStore) -> None:
        for request_id in ("r1", "r2"):
            requests.create(request(request_id), T0)
        found = requests.get_many("echo", ["r2", "nope", "r1"])
        assert found == {"r1": requests.get("echo", "r1"), "r2": requests.get("echo", "r2")}
        assert requests.get_many("echo", []) == {}

    def test_queued_requests_send_one_task_until_it_starts_and_the_next_only_while_some_are_left(
            self, requests: AsyncRequestStore) -> None:
        for request_id in ("r1", "r2", "r3"):
            assert requests.create(request(request_id), T0)
        assert requests.queue("echo", "r1")  # no task on its way: the caller sends one
        assert not requests.queue("echo", "r2")  # that one will take this too
        assert not requests.rearm("echo")  # still on its way
        requests.woken("echo")  # it started
        assert requests.queue("echo", "r3")  # queued after it started: another task
        requests.woken("echo")
        assert [r for r, _ in requests.claim("echo", "task-1", 3, T0 + 1)] == ["r1", "r2", "r3"]
        assert not requests.rearm("echo")  # nothing left queued: no task needed
        assert requests.create(request("r4"), T0)
        assert requests.queue("echo", "r4")  # nothing on its way: the caller sends a task
        requests.woken("echo")  # it started, but say its node died before claiming r4
        assert requests.rearm("echo") and not requests.rearm("echo")  # one task for what is left, not two

    def test_an_unknown_request_is_not_taken(self, requests: AsyncRequestStore) -> None:
        taken = requests.begin("echo", "nope", T0, owner="task-1")
        assert taken.status is None and not taken.runs

    # -- the node's in-flight hash ----------------------------------------------------------------
    def test_a_delivery_taking_a_request_enters_its_nodes_in_flight_hash_whatever_the_request_is(
            self, requests: AsyncRequestStore, nodes: NodeRegistry) -> None:
        requests.create(request("r1"), T0)
        assert requests.begin("echo", "r1", T0 + 1, owner="task-1", node="node-a").runs
        assert not requests.begin("echo", "r1", T0 + 2, owner="task-2", node="node-a").runs  # held by task-1
        assert not requests.begin("echo", "nope", T0 + 2, owner="task-3", node="node-b").runs  # unknown
        entry = request_entry("echo", "r1")
        assert nodes.inflight("node-a") == {"task-1": entry, "task-2": entry}
        assert nodes.inflight("node-b") == {"task-3": request_entry("echo", "nope")}
        requests.create(request("r2"), T0)
        assert requests.begin("echo", "r2", T0 + 3, owner="task-4").runs  # no node given: no entry
        assert set(nodes.inflight("node-a")) == {"task-1", "task-2"}

    def test_the_delivery_ending_with_an_outcome_leaves_its_nodes_in_flight_hash_even_when_too_late(
            self, requests: AsyncRequestStore, nodes: NodeRegistry) -> None:
        for request_id, owner in (("r1", "task-1"), ("r2", "task-2")):
            requests.create(request(request_id), T0)
            requests.begin("echo", request_id, T0 + 1, owner=owner, node="node-a")
        assert requests.finish("echo", "r1", RequestStatus.COMPLETED, T0 + 2, result=b"1",
                               ending=Delivery("node-a", "task-1"))
        assert nodes.inflight("node-a") == {"task-2": request_entry("echo", "r2")}  # the other delivery stays
        requests.finish("echo", "r2", RequestStatus.FAILED, T0 + 2, message="timed out")  # its watchdog: stays
        assert nodes.inflight("node-a") == {"task-2": request_entry("echo", "r2")}
        assert not requests.finish("echo", "r2", RequestStatus.COMPLETED, T0 + 3, result=b"2",
                                   ending=Delivery("node-a", "task-2"))  # too late, but its delivery ends
        assert nodes.inflight("node-a") == {}
        assert requests.get("echo", "r2").status is RequestStatus.FAILED  # type: ignore[union-attr]

    # -- ending ---------------------------------------------------------------------------------
    def test_a_request_ends_exactly_once_and_is_never_taken_after(self, requests: AsyncRequestStore) -> None:
        requests.create(request("r1"), T0)
        requests.begin("echo", "r1", T0 + 1, owner="task-1")
        assert requests.finish("echo", "r1", RequestStatus.COMPLETED, T0 + 2, result_uri="file:///r/result-1.json")
        assert not requests.finish("echo", "r1", RequestStatus.FAILED, T0 + 3, message="late")
        assert not requests.finish("echo", "r1", RequestStatus.COMPLETED, T0 + 3, result_uri="file:///r/result-2.json")
        record = requests.get("echo", "r1")
        assert record is not None
        assert (record.status, record.result_uri, record.message, record.timestamp) == (
            RequestStatus.COMPLETED, "file:///r/result-1.json", "", T0 + 2)
        taken = requests.begin("echo", "r1", T0 + 4, owner="task-1")
        assert taken.status is RequestStatus.COMPLETED and not taken.runs

    def test_a_small_result_is_kept_in_the_record_it_completes(self, requests: AsyncRequestStore) -> None:
        requests.create(request("r1"), T0)
        requests.begin("echo", "r1", T0 + 1, owner="task-1")
        assert requests.finish("echo", "r1", RequestStatus.COMPLETED, T0 + 2, result=b'{"label": "setosa"}')
        assert not requests.finish("echo", "r1", RequestStatus.COMPLETED, T0 + 3, result=b'{"label": "late"}')
        record = requests.get("echo", "r1")
        assert record is not None and (record.result, record.result_uri) == (b'{"label": "setosa"}', "")

    def test_a_queued_request_can_fail_before_any_node_takes_it(self, requests: AsyncRequestStore) -> None:
        requests.create(request("r1"), T0)
        assert requests.finish("echo", "r1", RequestStatus.FAILED, T0 + 1, message="queueing failed")
        record = requests.get("echo", "r1")
        assert record is not None and (record.status, record.message) == (RequestStatus.FAILED, "queueing failed")

    # -- batches --------------------------------------------------------------------------------
    def test_a_delivery_claims_queued_requests_oldest_first_up_to_its_limit(self, requests: AsyncRequestStore) -> None:
        queued(requests, "r1", "r2", "r3", "r4")
        assert requests.claim("echo", "task-9", 0, T0) == []
        assert requests.claim("echo", "task-9", 2, T0 + 1) == [("r1", 1), ("r2", 1)]
        assert requests.get("echo", "r1").status is RequestStatus.IN_PROGRESS  # type: ignore[union-attr]
        assert requests.begin("echo", "r2", T0 + 2, owner="task-2").held  # r2's own delivery leaves it
        assert requests.claim("echo", "task-8", 5, T0 + 3) == [("r3", 1), ("r4", 1)]
        assert requests.claim("echo", "task-8", 5, T0 + 4) == []
        assert requests.claim("other-api", "task-8", 5, T0 + 4) == []

    def test_a_claim_passes_over_requests_taken_or_ended_meanwhile(self, requests: AsyncRequestStore) -> None:
        queued(requests, "r1", "r2", "r3", "r4")
        requests.begin("echo", "r1", T0 + 1, owner="task-1")  # taken by its own delivery
        requests.finish("echo", "r2", RequestStatus.FAILED, T0 + 1, message="gone")
        assert requests.claim("echo", "task-9", 1, T0 + 2) == [("r3", 1)]
        assert requests.claim("echo", "task-9", 5, T0 + 2) == [("r4", 1)]

    def test_a_dead_deliverys_claims_are_taken_again_by_its_next_delivery(self, requests: AsyncRequestStore) -> None:
        queued(requests, "r1", "r2", "r3")
        requests.claim("echo", "task-9", 3, T0 + 1)
        requests.finish("echo", "r2", RequestStatus.COMPLETED, T0 + 2, result_uri="file:///r2")  # ended before it died
        assert sorted(requests.reclaim("echo", "task-9", T0 + 3)) == [("r1", 2), ("r3", 2)]
        assert requests.reclaim("echo", "task-8", T0 + 3) == []  # another delivery holds none of them
        requests.release("echo", "task-9")
        assert requests.reclaim("echo", "task-9", T0 + 4) == []

    # -- retention ------------------------------------------------------------------------------
    def test_a_request_expires_retention_after_its_last_change_and_is_removed(
            self, requests: AsyncRequestStore) -> None:
        requests.create(request("r1"), T0)
        requests.create(request("r2"), T0 + 5)
        requests.finish("echo", "r1", RequestStatus.COMPLETED, T0 + 10, result_uri="file:///r1")
        assert requests.expired(T0 + RETENTION_S + 4) == []
        assert requests.expired(T0 + RETENTION_S + 5) == [("echo", "r2")]
        assert requests.expired(T0 + RETENTION_S + 10) == [("echo", "r2"), ("echo", "r1")]
        assert requests.expired(T0 + RETENTION_S + 10, limit=1) == [("echo", "r2")]
        requests.remove("echo", "r2")
        assert requests.get("echo", "r2") is None
        assert requests.expired(T0 + RETENTION_S + 10) == [("echo", "r1")]

    # -- unstarted: requests whose message may have gone missing -----------------------------------
    def test_requests_beyond_the_messages_left_on_their_queue_are_unstarted_oldest_first(
            self, requests: AsyncRequestStore) -> None:
        for at, request_id in enumerate(("r1", "r2", "r3")):
            requests.create(request(request_id), T0 + at)
        assert requests.unstarted("echo", []) == ["r1", "r2", "r3"]  # no message on the queue for any
        assert requests.unstarted("echo", [], limit=2) == ["r1", "r2"]
        requests.send(QueuedMessage("async.echo", b"message"))  # one message left: the newest's
        assert requests.unstarted("echo", ["async.echo", "async.echo:priority"]) == ["r1", "r2"]
        for _ in range(2):
            requests.send(QueuedMessage("async.echo", b"message"))
        assert requests.unstarted("echo", ["async.echo"]) == []
        assert requests.unstarted("other-api", []) == []

    def test_a_request_taken_claimed_offered_to_batches_or_ended_is_not_unstarted(
            self, requests: AsyncRequestStore) -> None:
        for request_id in ("r1", "r2", "r3", "r4", "r5"):
            requests.create(request(request_id), T0)
        requests.begin("echo", "r1", T0 + 1, owner="task-1")
        requests.finish("echo", "r2", RequestStatus.FAILED, T0 + 1, message="storing its payload failed")
        requests.queue("echo", "r3")
        assert requests.unstarted("echo", []) == ["r4", "r5"]
        requests.claim("echo", "task-2", 1, T0 + 2)  # claims r3, offered to batches: nothing changes
        requests.remove("echo", "r4")
        assert requests.unstarted("echo", []) == ["r5"]
        requests.create(request("r6"), T0 + 3)  # stored later, listed later
        assert requests.unstarted("echo", []) == ["r5", "r6"]

    def test_a_batchs_outcomes_are_recorded_together_each_once(self, requests: AsyncRequestStore) -> None:
        for request_id in ("r1", "r2", "r3", "r4"):
            requests.create(request(request_id), T0)
        requests.finish("echo", "r4", RequestStatus.FAILED, T0 + 1, message="its node gave up")
        recorded = requests.finish_many("echo", [
            Outcome("r1", RequestStatus.COMPLETED, result=b'{"y": 1}'),
            Outcome("r2", RequestStatus.COMPLETED, result_uri="file:///results/r2"),
            Outcome("r3", RequestStatus.FAILED, message="predict returned a set"),
            Outcome("r4", RequestStatus.COMPLETED, result=b"late"),
        ], T0 + 2)
        assert recorded == [True, True, True, False]
        r1, r2, r3, r4 = (requests.get("echo", r) for r in ("r1", "r2", "r3", "r4"))
        assert (r1.status, r1.result, r1.timestamp) == (RequestStatus.COMPLETED, b'{"y": 1}', T0 + 2)  # type: ignore[union-attr]
        assert (r2.status, r2.result_uri) == (RequestStatus.COMPLETED, "file:///results/r2")  # type: ignore[union-attr]
        assert (r3.status, r3.message) == (RequestStatus.FAILED, "predict returned a set")  # type: ignore[union-attr]
        assert (r4.status, r4.message) == (RequestStatus.FAILED, "its node gave up")  # type: ignore[union-attr]
        assert requests.finish_many("echo", [Outcome("r1", RequestStatus.FAILED, message="again")], T0 + 3) == [False]
        assert requests.finish_many("echo", [], T0 + 3) == []
        counts = requests.counts("echo", T0 + 3 + 10)  # the per-minute figures trail by a slot of 10 s
        assert (counts.in_queue, counts.completed_per_minute, counts.failed_per_minute) == (0, 2, 2)
