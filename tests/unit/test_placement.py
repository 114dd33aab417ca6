"""Placement over the in-memory job store and node registry keeps placement's contract
(`tests/contracts/placement.py`): a job runs on at most `workers` live nodes of its hardware, and heals
when one is lost. The same contract runs over Redis's parts in tests/integration/test_placement_redis.py.

Beside it, giving back a dead node's batches and settling a reconnecting node's, over the fakes: which
deliveries are acknowledged, which go back and which queues are dropped (the messages themselves move
in kombu, tested against Redis in tests/integration/test_give_back.py and test_settle.py).
"""

from __future__ import annotations

import pytest

from jobs.batch.job import Job, JobStatus
from jobs.nodes.memory import MemoryNodes
from jobs.nodes.registry import GIVE_BACK_AFTER_TTLS
from jobs.placement.batch import Placement
from jobs.store import JobField
from jobs.store.memory import MemoryJobStore
from jobs.transport.delivery import COMPLETION_ENTRY, Delivery, inflight_entry
from jobs.transport.memory import MemoryJobQueues
from jobs.transport.settle import give_back, settle_deliveries
from tests.contracts.placement import NODE_TTL_S, T0, DamageRecord, PlacementContract, submit


class TestPlacementOverTheMemoryFakes(PlacementContract):
    @pytest.fixture
    def store(self) -> MemoryJobStore:
        return MemoryJobStore()

    @pytest.fixture
    def nodes(self, store: MemoryJobStore) -> MemoryNodes:
        return MemoryNodes(NODE_TTL_S, inflight=store.inflight)

    @pytest.fixture
    def damage_record(self, store: MemoryJobStore) -> DamageRecord:
        def damage(job_id: str, text: str) -> None:
            store.hash_of(job_id)[JobField.RECORD] = text

        return damage


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()


@pytest.fixture
def nodes(store: MemoryJobStore) -> MemoryNodes:
    return MemoryNodes(NODE_TTL_S, inflight=store.inflight)


@pytest.fixture
def queues() -> MemoryJobQueues:
    return MemoryJobQueues()


def holding(store: MemoryJobStore, node: str, job: Job, *indexes: int) -> list[str]:
    """`node` took these batches of `job` (each begun under a task id of its own); returns the task ids."""
    tasks = []
    for index in indexes:
        tasks.append(f"task-{job.job_id}-{index}")
        store.begin_batch(job.job_id, index, Delivery(node, tasks[-1]))
    return tasks


@pytest.mark.parametrize("last_heartbeat_ttls_ago", [None, GIVE_BACK_AFTER_TTLS + 1])
def test_reconcile_gives_back_what_a_node_silent_for_long_or_gone_held(
    store: MemoryJobStore, nodes: MemoryNodes, queues: MemoryJobQueues, last_heartbeat_ttls_ago: float | None
) -> None:
    job = submit(store, "job-a")
    held = holding(store, "dead@host", job, 1)
    if last_heartbeat_ttls_ago is not None:
        nodes.heartbeat("dead@host", ["cpu"], T0 - last_heartbeat_ttls_ago * NODE_TTL_S)

    Placement(queues, store, nodes).reconcile(T0)

    assert queues.given_back == held and nodes.inflight("dead@host") == {}
    assert queues.dropped == []  # its job still runs: the batch goes back to its queue


@pytest.mark.parametrize("last_heartbeat_ttls_ago", [0, GIVE_BACK_AFTER_TTLS - 1])
def test_reconcile_leaves_a_node_silent_for_less_than_the_give_back_time_its_batch(
    store: MemoryJobStore, nodes: MemoryNodes, queues: MemoryJobQueues, last_heartbeat_ttls_ago: float
) -> None:
    job = submit(store, "job-b")
    holding(store, "slow@host", job, 2)
    nodes.heartbeat("slow@host", ["cpu"], T0 - last_heartbeat_ttls_ago * NODE_TTL_S)  # maybe only slow: the GIL

    Placement(queues, store, nodes).reconcile(T0)

    assert queues.given_back == [] and list(nodes.inflight("slow@host").values()) == ["job-b:2"]


def test_giving_back_the_batch_of_a_job_that_ended_meanwhile_drops_its_queue(
    store: MemoryJobStore, nodes: MemoryNodes, queues: MemoryJobQueues
) -> None:
    job = submit(store, "job-d")
    holding(store, "dead@host", job, 0)
    store.transition(job.job_id, JobStatus.STOPPED)

    assert give_back("dead@host", nodes, store, queues) == 1

    assert queues.dropped == ["job.job-d"] and nodes.inflight("dead@host") == {}
    assert give_back("dead@host", nodes, store, queues) == 0


def test_a_reconnecting_node_acknowledges_what_is_recorded_and_gives_back_the_rest(
    store: MemoryJobStore, nodes: MemoryNodes, queues: MemoryJobQueues
) -> None:
    job = submit(store, "job-s")
    recorded, unrecorded = holding(store, "alive@host", job, 0, 1)
    store.record_success(job.job_id, 0, 0.1)  # recorded, but its ack was lost with the connection

    settled = settle_deliveries("alive@host", nodes, store, store, queues)

    assert (settled.acknowledged, settled.given_back) == ([recorded], 1)
    assert (queues.acknowledged, queues.given_back) == ([recorded], [unrecorded])
    assert nodes.inflight("alive@host") == {}


def test_the_completion_of_an_ended_job_is_acknowledged_and_one_still_due_given_back(
    store: MemoryJobStore, nodes: MemoryNodes, queues: MemoryJobQueues
) -> None:
    for job_id in ("job-ended", "job-due"):
        submit(store, job_id)
        nodes.begin_delivery(Delivery("alive@host", f"complete-{job_id}"), inflight_entry(job_id, COMPLETION_ENTRY))
    store.transition("job-ended", JobStatus.SUCCEEDED)

    settled = settle_deliveries("alive@host", nodes, store, store, queues)

    assert (settled.acknowledged, settled.given_back) == (["complete-job-ended"], 1)
    assert queues.given_back == ["complete-job-due"]


def test_a_node_running_a_task_settles_nothing_yet_and_one_holding_nothing_settles_nothing(
    store: MemoryJobStore, nodes: MemoryNodes, queues: MemoryJobQueues
) -> None:
    job = submit(store, "job-c")
    running, other = holding(store, "busy@host", job, 0, 1)

    assert settle_deliveries("busy@host", nodes, store, store, queues, running={running}).given_back == 0
    assert settle_deliveries("idle@host", nodes, store, store, queues).given_back == 0

    assert sorted(nodes.inflight("busy@host")) == sorted([running, other])
    assert queues.acknowledged == queues.given_back == []
