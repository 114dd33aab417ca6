"""Placement's contract (`jobs.placement.batch.JobPlacement`): a job runs on at most `workers` live nodes of its
hardware, and heals when one is lost.

`Placement` works over any job records and node registry; fixtures a subclass provides: `store`
(an empty job store) and `nodes` (an empty node registry with a node TTL of `NODE_TTL_S`, sharing
`store`'s in-flight hashes), and `damage_record(job_id, text)` (overwrites a job's stored record).
The broadcasts go to `queues`, a `MemoryJobQueues` that remembers them (Celery's control is tested
against a live stack in tests/integration/). Run with the in-memory fakes in tests/unit/test_placement.py,
and with Redis's parts and the fakes in tests/integration/test_placement_redis.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from jobs.batch.job import Job, JobStatus
from jobs.nodes.registry import NodeRegistry
from jobs.placement.batch import Placement
from jobs.store import JobStorage
from jobs.transport.delivery import Delivery
from jobs.transport.memory import MemoryJobQueues

T0 = 1_700_000_000.0
NODE_TTL_S = 15.0

DamageRecord = Callable[[str, str], None]


def submit(store: JobStorage, job_id: str, workers: int = 1, hardware_queue: str = "cpu") -> Job:
    job = Job(
        job_id=job_id,
        api_name="iris",
        workers=workers,
        config={},
        timeout=None,
        total_batch_count=10,
        start_time=T0,
        hardware_queue=hardware_queue,
    )
    store.create(job, JobStatus.RUNNING)
    return job


def calls(queues: MemoryJobQueues) -> list[tuple[str, str, list[str]]]:
    return queues.calls


def hang_a_batch_on(store: JobStorage, node: str, job_id: str) -> None:
    """`node` runs batch 0 of `job_id` and has not finished it (its in-flight hash says so)."""
    store.begin_batch(job_id, 0, Delivery(node, f"task-{job_id}-0"))


class PlacementContract:
    @pytest.fixture
    def queues(self) -> MemoryJobQueues:
        return MemoryJobQueues()

    @pytest.fixture
    def placement(self, queues: MemoryJobQueues, store: JobStorage, nodes: NodeRegistry) -> Placement:
        return Placement(queues, store, nodes)

    # -- the node registry --------------------------------------------------------------------------
    def test_a_node_serving_only_job_queues_is_chosen_for_no_hardware(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["job.cpu", "job.other"], now=T0)
        job = submit(store, "j1", hardware_queue="cpu")

        assert placement.assign(job, now=T0) == []
        assert calls(queues) == []

    # -- assigning a new job ------------------------------------------------------------------------
    def test_a_job_gets_at_most_its_workers_nodes_among_those_with_its_hardware(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        for node, hardware in [("celery@c1", ["cpu"]), ("celery@g1", ["gpu"]),
                               ("celery@c2", ["cpu", "sluice.maintenance"]), ("celery@c3", ["cpu"])]:
            nodes.heartbeat(node, hardware, now=T0)
        job = submit(store, "j1", workers=2)

        chosen = placement.assign(job, now=T0)

        assert chosen == ["celery@c1", "celery@c2"]
        assert store.state("j1").nodes == chosen
        assert calls(queues) == [("add", "job.j1", ["celery@c1", "celery@c2"])]

    def test_a_job_asking_for_more_workers_than_there_are_nodes_gets_every_eligible_one(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@g1", ["gpu"], now=T0)
        nodes.heartbeat("celery@g2", ["gpu"], now=T0)
        nodes.heartbeat("celery@c1", ["cpu"], now=T0)
        job = submit(store, "j1", workers=5, hardware_queue="gpu")

        assert placement.assign(job, now=T0) == ["celery@g1", "celery@g2"]
        assert calls(queues) == [("add", "job.j1", ["celery@g1", "celery@g2"])]

    def test_a_new_job_goes_to_the_least_loaded_nodes_first(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        for node in ("celery@a", "celery@b", "celery@c"):
            nodes.heartbeat(node, ["cpu"], now=T0)
        store.set_nodes(submit(store, "busy-1").job_id, ["celery@a", "celery@b"])
        store.set_nodes(submit(store, "busy-2").job_id, ["celery@a"])

        assert placement.assign(submit(store, "new-1"), now=T0) == ["celery@c"]
        assert placement.assign(submit(store, "new-2", workers=2), now=T0) == ["celery@b", "celery@c"]

    def test_nodes_of_ended_jobs_count_as_free(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        nodes.heartbeat("celery@b", ["cpu"], now=T0)
        old = submit(store, "old")
        store.set_nodes(old.job_id, ["celery@a"])
        store.transition(old.job_id, JobStatus.SUCCEEDED, now=T0)

        assert placement.assign(submit(store, "new"), now=T0) == ["celery@a"]

    def test_a_stale_node_is_never_assigned(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@stale", ["cpu"], now=T0 - 60)
        nodes.heartbeat("celery@live", ["cpu"], now=T0)

        assert placement.assign(submit(store, "j1", workers=2), now=T0) == ["celery@live"]

    def test_a_job_with_no_live_node_of_its_hardware_waits_and_is_placed_when_one_appears(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@c1", ["cpu"], now=T0)
        job = submit(store, "j1", hardware_queue="gpu")

        assert placement.assign(job, now=T0) == []
        assert store.state("j1").nodes == []
        assert calls(queues) == []

        nodes.heartbeat("celery@g1", ["gpu"], now=T0 + 30)
        placement.reconcile(now=T0 + 30)

        assert store.state("j1").nodes == ["celery@g1"]
        assert calls(queues) == [("add", "job.j1", ["celery@g1"])]

    # -- reconciling --------------------------------------------------------------------------------
    def test_a_lost_nodes_share_moves_to_a_live_node(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        for node in ("celery@a", "celery@b", "celery@c"):
            nodes.heartbeat(node, ["cpu"], now=T0)
        job = submit(store, "j1", workers=2)
        assert placement.assign(job, now=T0) == ["celery@a", "celery@b"]
        queues.calls.clear()

        later = T0 + 60  # b went silent; a and c kept beating
        nodes.heartbeat("celery@a", ["cpu"], now=later)
        nodes.heartbeat("celery@c", ["cpu"], now=later)
        placement.reconcile(now=later)

        assert store.state("j1").nodes == ["celery@a", "celery@c"]
        assert calls(queues) == [
            ("cancel", "job.j1", ["celery@b"]),
            ("add", "job.j1", ["celery@a", "celery@c"]),
        ]

    def test_a_job_whose_only_node_is_lost_waits_with_none_until_another_appears(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        placement.assign(submit(store, "j1"), now=T0)
        queues.calls.clear()

        placement.reconcile(now=T0 + 60)

        assert store.state("j1").nodes == []
        assert calls(queues) == [("cancel", "job.j1", ["celery@a"])]

    def test_reconciling_resends_the_consumer_commands_to_nodes_that_keep_their_job(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        placement.assign(submit(store, "j1"), now=T0)

        placement.reconcile(now=T0 + 5)
        placement.reconcile(now=T0 + 10)

        assert store.state("j1").nodes == ["celery@a"]
        assert calls(queues) == [("add", "job.j1", ["celery@a"])] * 3

    def test_reconciling_spreads_replacements_over_the_least_loaded_nodes(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry,
    ) -> None:
        for node in ("celery@a", "celery@b", "celery@c"):
            nodes.heartbeat(node, ["cpu"], now=T0)
        store.set_nodes(submit(store, "j1").job_id, ["celery@lost"])
        store.set_nodes(submit(store, "j2").job_id, ["celery@lost"])
        store.set_nodes(submit(store, "j3").job_id, ["celery@a"])

        placement.reconcile(now=T0)

        assert [store.state(j).nodes for j in ("j1", "j2", "j3")] == [["celery@b"], ["celery@c"], ["celery@a"]]

    def test_reconciling_leaves_ended_jobs_alone(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        job = submit(store, "j1")
        store.transition(job.job_id, JobStatus.STOPPED, now=T0)

        placement.reconcile(now=T0)

        assert store.state("j1").nodes == []
        assert calls(queues) == []

    def test_a_broker_hiccup_while_broadcasting_does_not_lose_the_assignment(
        self, store: JobStorage, nodes: NodeRegistry
    ) -> None:
        class FailingQueues(MemoryJobQueues):
            def add_consumers(self, queue: str, nodes: list[str]) -> None:
                raise ConnectionError("broker went away")

        placement = Placement(FailingQueues(), store, nodes)
        nodes.heartbeat("celery@a", ["cpu"], now=T0)

        assert placement.assign(submit(store, "j1"), now=T0) == ["celery@a"]
        assert store.state("j1").nodes == ["celery@a"]

    def test_a_job_keeps_its_hardware_when_it_moves(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@g1", ["gpu"], now=T0)
        nodes.heartbeat("celery@c1", ["cpu"], now=T0)
        job = submit(store, "j1", hardware_queue="gpu")
        placement.assign(job, now=T0)

        nodes.heartbeat("celery@c1", ["cpu"], now=T0 + 60)
        nodes.heartbeat("celery@g2", ["gpu"], now=T0 + 60)
        placement.reconcile(now=T0 + 60)

        assert store.state("j1").nodes == ["celery@g2"]

    def test_a_job_short_of_workers_takes_a_node_that_joins_later(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        job = submit(store, "j1", workers=2)
        assert placement.assign(job, now=T0) == ["celery@a"]

        nodes.heartbeat("celery@b", ["cpu"], now=T0 + 1)
        placement.reconcile(now=T0 + 1)

        assert store.state("j1").nodes == ["celery@a", "celery@b"]
        assert calls(queues)[-1] == ("add", "job.j1", ["celery@a", "celery@b"])

    def test_reconcile_leaves_a_json_lines_job_alone_until_its_input_is_validated(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        job = Job(job_id="lines", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=0,
                  start_time=T0, source="delimited_files")
        store.create(job, JobStatus.ENQUEUING)

        placement.reconcile(T0)
        assert calls(queues) == []
        assert store.state("lines").nodes == []

        store.transition("lines", JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING])
        placement.reconcile(T0)
        assert calls(queues) == [("add", "job.lines", ["celery@a"])]

    def test_a_node_that_stops_serving_the_jobs_hardware_queue_is_replaced(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        job = submit(store, "j1")
        assert placement.assign(job, T0) == ["celery@a"]

        nodes.heartbeat("celery@a", ["gpu"], now=T0 + 1)
        nodes.heartbeat("celery@b", ["cpu"], now=T0 + 1)
        placement.reconcile(T0 + 1)

        assert store.state("j1").nodes == ["celery@b"]

    # -- nodes held by ended jobs -------------------------------------------------------------------
    def test_a_node_still_running_a_batch_of_an_ended_job_is_not_chosen_while_another_is_free(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        nodes.heartbeat("celery@b", ["cpu"], now=T0)
        hung = submit(store, "hung")
        assert placement.assign(hung, now=T0) == ["celery@a"]
        hang_a_batch_on(store, "celery@a", "hung")
        store.transition("hung", JobStatus.TIMED_OUT, now=T0 + 1)  # its predictor never returned

        assert placement.assign(submit(store, "next"), now=T0 + 2) == ["celery@b"]

    def test_a_job_waits_while_its_only_node_is_held_by_an_ended_job_and_gets_it_once_freed(
        self, placement: Placement, store: JobStorage, queues: MemoryJobQueues, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        placement.assign(submit(store, "hung"), now=T0)
        hang_a_batch_on(store, "celery@a", "hung")
        store.transition("hung", JobStatus.STOPPED, now=T0 + 1)

        assert placement.assign(submit(store, "next"), now=T0 + 2) == []
        placement.reconcile(now=T0 + 3)
        assert store.state("next").nodes == []

        # its watchdog ended it; the new process gave it back
        placement.nodes.forget_inflight("celery@a", placement.nodes.inflight("celery@a"))
        nodes.heartbeat("celery@a", ["cpu"], now=T0 + 4)
        placement.reconcile(now=T0 + 4)

        assert store.state("next").nodes == ["celery@a"]
        assert calls(queues)[-1] == ("add", "job.next", ["celery@a"])

    def test_a_node_running_a_batch_of_an_active_job_is_only_loaded_not_held(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        running = submit(store, "running")
        placement.assign(running, now=T0)
        hang_a_batch_on(store, "celery@a", "running")

        assert placement.held_by_ended_jobs(["celery@a"]) == set()
        assert placement.assign(submit(store, "next"), now=T0 + 1) == ["celery@a"]

    # -- one bad record never stops a step -------------------------------------------------------
    def test_a_job_whose_record_breaks_placement_does_not_keep_the_others_from_their_nodes(
        self, placement: Placement, store: JobStorage, nodes: NodeRegistry, damage_record: DamageRecord,
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        bad = submit(store, "a-bad")
        submit(store, "b-good")
        submit(store, "c-corrupt")
        damage_record("a-bad", json.dumps({**bad.to_dict(), "workers": "two"}))
        damage_record("c-corrupt", "{not json")

        placement.reconcile(now=T0)
        assert placement.assign(submit(store, "d-new"), now=T0) == ["celery@a"]

        assert store.state("b-good").nodes == ["celery@a"]
        assert placement.assigned_queues("celery@a") == ["job.b-good", "job.d-new"]

    # -- restarting nodes ----------------------------------------------------------------------------
    def test_a_restarting_node_finds_the_queues_of_the_active_jobs_placed_on_it(
        self, placement: Placement, store: JobStorage
    ) -> None:
        store.set_nodes(submit(store, "mine").job_id, ["celery@a", "celery@b"])
        store.set_nodes(submit(store, "theirs").job_id, ["celery@b"])
        ended = submit(store, "ended")
        store.set_nodes(ended.job_id, ["celery@a"])
        store.transition("ended", JobStatus.STOPPED, now=T0)

        assert placement.assigned_queues("celery@a") == ["job.mine"]
