"""Placement: a job runs on at most `workers` live nodes of its hardware, and heals when one is lost."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from jobs.job import Job, JobStatus
from foundation.keys import NODES as NODES_KEY
from jobs.nodes import write_heartbeat
from jobs.placement import Placement
from jobs.nodes import Delivery
from jobs.store import JobStore

T0 = 1_700_000_000.0
NODE_TTL_S = 15.0


class FakeControl:
    """Stands in for `celery.control`: records the consumer commands Placement broadcasts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []

    def add_consumer(self, queue: str, destination: list[str], reply: bool) -> None:
        assert reply is False
        self.calls.append(("add", queue, list(destination)))

    def cancel_consumer(self, queue: str, destination: list[str], reply: bool) -> None:
        assert reply is False
        self.calls.append(("cancel", queue, list(destination)))


class FakeCelery:
    def __init__(self) -> None:
        self.control = FakeControl()


@pytest.fixture
def store(redis_client: redis.Redis) -> JobStore:
    return JobStore(redis_client)


@pytest.fixture
def celery() -> FakeCelery:
    return FakeCelery()


@pytest.fixture
def placement(celery: FakeCelery, store: JobStore, redis_client: redis.Redis) -> Placement:
    return Placement(celery, store, redis_client, node_ttl_s=NODE_TTL_S)  # type: ignore[arg-type]


def submit(store: JobStore, job_id: str, workers: int = 1, hardware_queue: str = "cpu") -> Job:
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


def calls(celery: FakeCelery) -> list[tuple[str, str, list[str]]]:
    return celery.control.calls


# -- the node registry --------------------------------------------------------------------------
def test_a_node_is_live_while_its_heartbeat_is_younger_than_the_node_ttl(placement: Placement) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    placement.heartbeat("celery@b", ["gpu"], now=T0 - 10)

    assert placement.live_nodes(T0) == {"celery@a": ["cpu"], "celery@b": ["gpu"]}
    assert placement.live_nodes(T0 + NODE_TTL_S - 10) == {"celery@a": ["cpu"], "celery@b": ["gpu"]}
    assert placement.live_nodes(T0 + NODE_TTL_S) == {"celery@a": ["cpu"]}
    assert placement.live_nodes(T0 + NODE_TTL_S + 0.1) == {}


def test_a_fresh_heartbeat_brings_a_silent_node_back(placement: Placement) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    assert placement.live_nodes(T0 + 60) == {}

    placement.heartbeat("celery@a", ["cpu"], now=T0 + 59)

    assert placement.live_nodes(T0 + 60) == {"celery@a": ["cpu"]}


def test_a_node_silent_for_long_is_dropped_from_the_registry(
    placement: Placement, redis_client: redis.Redis
) -> None:
    placement.heartbeat("celery@gone", ["cpu"], now=T0)
    placement.heartbeat("celery@quiet", ["cpu"], now=T0 + 100)

    assert placement.live_nodes(T0 + 20 * NODE_TTL_S + 1) == {}

    assert redis_client.hkeys(NODES_KEY) == [b"celery@quiet"]


def test_a_node_that_says_goodbye_is_no_longer_live(placement: Placement) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)

    placement.forget_node("celery@a")

    assert placement.live_nodes(T0) == {}


def test_job_queues_a_node_consumes_are_not_counted_as_its_hardware_queues(
    placement: Placement, redis_client: redis.Redis
) -> None:
    write_heartbeat(redis_client, "celery@a", ["job.0018bcfe5680", "cpu", "sluice.maintenance", "job.x"], now=T0)

    assert placement.live_nodes(T0) == {"celery@a": ["cpu", "sluice.maintenance"]}
    assert json.loads(redis_client.hget(NODES_KEY, "celery@a")) == {
        "queues": ["cpu", "sluice.maintenance"],
        "seen": T0,
    }


def test_a_node_serving_only_job_queues_is_chosen_for_no_hardware(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@a", ["job.cpu", "job.other"], now=T0)
    job = submit(store, "j1", hardware_queue="cpu")

    assert placement.assign(job, now=T0) == []
    assert calls(celery) == []


# -- assigning a new job ------------------------------------------------------------------------
def test_a_job_gets_at_most_its_workers_nodes_among_those_with_its_hardware(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    for node, queues in [("celery@c1", ["cpu"]), ("celery@g1", ["gpu"]), ("celery@c2", ["cpu", "sluice.maintenance"]),
                         ("celery@c3", ["cpu"])]:
        placement.heartbeat(node, queues, now=T0)
    job = submit(store, "j1", workers=2)

    nodes = placement.assign(job, now=T0)

    assert nodes == ["celery@c1", "celery@c2"]
    assert store.state("j1").nodes == nodes
    assert calls(celery) == [("add", "job.j1", ["celery@c1", "celery@c2"])]


def test_a_job_asking_for_more_workers_than_there_are_nodes_gets_every_eligible_one(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@g1", ["gpu"], now=T0)
    placement.heartbeat("celery@g2", ["gpu"], now=T0)
    placement.heartbeat("celery@c1", ["cpu"], now=T0)
    job = submit(store, "j1", workers=5, hardware_queue="gpu")

    assert placement.assign(job, now=T0) == ["celery@g1", "celery@g2"]
    assert calls(celery) == [("add", "job.j1", ["celery@g1", "celery@g2"])]


def test_a_new_job_goes_to_the_least_loaded_nodes_first(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    for node in ("celery@a", "celery@b", "celery@c"):
        placement.heartbeat(node, ["cpu"], now=T0)
    store.set_nodes(submit(store, "busy-1").job_id, ["celery@a", "celery@b"])
    store.set_nodes(submit(store, "busy-2").job_id, ["celery@a"])

    assert placement.assign(submit(store, "new-1"), now=T0) == ["celery@c"]
    assert placement.assign(submit(store, "new-2", workers=2), now=T0) == ["celery@b", "celery@c"]


def test_nodes_of_ended_jobs_count_as_free(placement: Placement, store: JobStore) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    placement.heartbeat("celery@b", ["cpu"], now=T0)
    old = submit(store, "old")
    store.set_nodes(old.job_id, ["celery@a"])
    store.transition(old.job_id, JobStatus.SUCCEEDED, now=T0)

    assert placement.assign(submit(store, "new"), now=T0) == ["celery@a"]


def test_a_stale_node_is_never_assigned(placement: Placement, store: JobStore, celery: FakeCelery) -> None:
    placement.heartbeat("celery@stale", ["cpu"], now=T0 - 60)
    placement.heartbeat("celery@live", ["cpu"], now=T0)

    assert placement.assign(submit(store, "j1", workers=2), now=T0) == ["celery@live"]


def test_a_job_with_no_live_node_of_its_hardware_waits_and_is_placed_when_one_appears(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@c1", ["cpu"], now=T0)
    job = submit(store, "j1", hardware_queue="gpu")

    assert placement.assign(job, now=T0) == []
    assert store.state("j1").nodes == []
    assert calls(celery) == []

    placement.heartbeat("celery@g1", ["gpu"], now=T0 + 30)
    placement.reconcile(now=T0 + 30)

    assert store.state("j1").nodes == ["celery@g1"]
    assert calls(celery) == [("add", "job.j1", ["celery@g1"])]


# -- reconciling --------------------------------------------------------------------------------
def test_a_lost_nodes_share_moves_to_a_live_node(placement: Placement, store: JobStore, celery: FakeCelery) -> None:
    for node in ("celery@a", "celery@b", "celery@c"):
        placement.heartbeat(node, ["cpu"], now=T0)
    job = submit(store, "j1", workers=2)
    assert placement.assign(job, now=T0) == ["celery@a", "celery@b"]
    celery.control.calls.clear()

    later = T0 + 60  # b went silent; a and c kept beating
    placement.heartbeat("celery@a", ["cpu"], now=later)
    placement.heartbeat("celery@c", ["cpu"], now=later)
    placement.reconcile(now=later)

    assert store.state("j1").nodes == ["celery@a", "celery@c"]
    assert calls(celery) == [
        ("cancel", "job.j1", ["celery@b"]),
        ("add", "job.j1", ["celery@a", "celery@c"]),
    ]


def test_a_job_whose_only_node_is_lost_waits_with_none_until_another_appears(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    placement.assign(submit(store, "j1"), now=T0)
    celery.control.calls.clear()

    placement.reconcile(now=T0 + 60)

    assert store.state("j1").nodes == []
    assert calls(celery) == [("cancel", "job.j1", ["celery@a"])]


def test_reconciling_resends_the_consumer_commands_to_nodes_that_keep_their_job(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    placement.assign(submit(store, "j1"), now=T0)

    placement.reconcile(now=T0 + 5)
    placement.reconcile(now=T0 + 10)

    assert store.state("j1").nodes == ["celery@a"]
    assert calls(celery) == [("add", "job.j1", ["celery@a"])] * 3


def test_reconciling_spreads_replacements_over_the_least_loaded_nodes(
    placement: Placement, store: JobStore
) -> None:
    for node in ("celery@a", "celery@b", "celery@c"):
        placement.heartbeat(node, ["cpu"], now=T0)
    store.set_nodes(submit(store, "j1").job_id, ["celery@lost"])
    store.set_nodes(submit(store, "j2").job_id, ["celery@lost"])
    store.set_nodes(submit(store, "j3").job_id, ["celery@a"])

    placement.reconcile(now=T0)

    assert [store.state(j).nodes for j in ("j1", "j2", "j3")] == [["celery@b"], ["celery@c"], ["celery@a"]]


def test_reconciling_leaves_ended_jobs_alone(placement: Placement, store: JobStore, celery: FakeCelery) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    job = submit(store, "j1")
    store.transition(job.job_id, JobStatus.STOPPED, now=T0)

    placement.reconcile(now=T0)

    assert store.state("j1").nodes == []
    assert calls(celery) == []


def test_a_broker_hiccup_while_broadcasting_does_not_lose_the_assignment(
    store: JobStore, redis_client: redis.Redis
) -> None:
    class FailingControl:
        def add_consumer(self, *args: Any, **kwargs: Any) -> None:
            raise ConnectionError("broker went away")

    celery = FakeCelery()
    celery.control = FailingControl()  # type: ignore[assignment]
    placement = Placement(celery, store, redis_client, node_ttl_s=NODE_TTL_S)  # type: ignore[arg-type]
    placement.heartbeat("celery@a", ["cpu"], now=T0)

    assert placement.assign(submit(store, "j1"), now=T0) == ["celery@a"]
    assert store.state("j1").nodes == ["celery@a"]


def test_a_job_keeps_its_hardware_when_it_moves(placement: Placement, store: JobStore) -> None:
    placement.heartbeat("celery@g1", ["gpu"], now=T0)
    placement.heartbeat("celery@c1", ["cpu"], now=T0)
    job = submit(store, "j1", hardware_queue="gpu")
    placement.assign(job, now=T0)

    placement.heartbeat("celery@c1", ["cpu"], now=T0 + 60)
    placement.heartbeat("celery@g2", ["gpu"], now=T0 + 60)
    placement.reconcile(now=T0 + 60)

    assert store.state("j1").nodes == ["celery@g2"]


def test_a_job_short_of_workers_takes_a_node_that_joins_later(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    job = submit(store, "j1", workers=2)
    assert placement.assign(job, now=T0) == ["celery@a"]

    placement.heartbeat("celery@b", ["cpu"], now=T0 + 1)
    placement.reconcile(now=T0 + 1)

    assert store.state("j1").nodes == ["celery@a", "celery@b"]
    assert calls(celery)[-1] == ("add", "job.j1", ["celery@a", "celery@b"])


def test_reconcile_leaves_a_json_lines_job_alone_until_its_input_is_validated(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    job = Job(job_id="lines", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=0,
              start_time=T0, source="delimited_files")
    store.create(job, JobStatus.ENQUEUING)

    placement.reconcile(T0)
    assert calls(celery) == []
    assert store.state("lines").nodes == []

    store.transition("lines", JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING])
    placement.reconcile(T0)
    assert calls(celery) == [("add", "job.lines", ["celery@a"])]


def test_a_node_that_stops_serving_the_jobs_hardware_queue_is_replaced(
    placement: Placement, store: JobStore
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    job = submit(store, "j1")
    assert placement.assign(job, T0) == ["celery@a"]

    placement.heartbeat("celery@a", ["gpu"], now=T0 + 1)
    placement.heartbeat("celery@b", ["cpu"], now=T0 + 1)
    placement.reconcile(T0 + 1)

    assert store.state("j1").nodes == ["celery@b"]


# -- nodes held by ended jobs -------------------------------------------------------------------
def hang_a_batch_on(store: JobStore, node: str, job_id: str) -> None:
    """`node` runs batch 0 of `job_id` and has not finished it (its in-flight hash says so)."""
    store.begin_batch(job_id, 0, Delivery(node, f"task-{job_id}-0"))


def test_a_node_still_running_a_batch_of_an_ended_job_is_not_chosen_while_another_is_free(
    placement: Placement, store: JobStore
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    placement.heartbeat("celery@b", ["cpu"], now=T0)
    hung = submit(store, "hung")
    assert placement.assign(hung, now=T0) == ["celery@a"]
    hang_a_batch_on(store, "celery@a", "hung")
    store.transition("hung", JobStatus.TIMED_OUT, now=T0 + 1)  # its predictor never returned

    assert placement.assign(submit(store, "next"), now=T0 + 2) == ["celery@b"]


def test_a_job_waits_while_its_only_node_is_held_by_an_ended_job_and_gets_it_once_freed(
    placement: Placement, store: JobStore, celery: FakeCelery
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    placement.assign(submit(store, "hung"), now=T0)
    hang_a_batch_on(store, "celery@a", "hung")
    store.transition("hung", JobStatus.STOPPED, now=T0 + 1)

    assert placement.assign(submit(store, "next"), now=T0 + 2) == []
    placement.reconcile(now=T0 + 3)
    assert store.state("next").nodes == []

    placement.nodes.forget_inflight("celery@a", placement.nodes.inflight("celery@a"))  # its watchdog ended it; the new process gave it back
    placement.heartbeat("celery@a", ["cpu"], now=T0 + 4)
    placement.reconcile(now=T0 + 4)

    assert store.state("next").nodes == ["celery@a"]
    assert calls(celery)[-1] == ("add", "job.next", ["celery@a"])


def test_a_node_running_a_batch_of_an_active_job_is_only_loaded_not_held(
    placement: Placement, store: JobStore
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    running = submit(store, "running")
    placement.assign(running, now=T0)
    hang_a_batch_on(store, "celery@a", "running")

    assert placement.held_by_ended_jobs(["celery@a"]) == set()
    assert placement.assign(submit(store, "next"), now=T0 + 1) == ["celery@a"]


# -- one bad record never stops a step ----------------------------------------------------------
def test_a_job_whose_record_breaks_placement_does_not_keep_the_others_from_their_nodes(
    placement: Placement, store: JobStore, redis_client: redis.Redis
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    submit(store, "a-bad")
    submit(store, "b-good")
    bad = json.loads(redis_client.hget("sluice:job:a-bad", "record"))
    redis_client.hset("sluice:job:a-bad", "record", json.dumps({**bad, "workers": "two"}))
    redis_client.hset("sluice:job:c-corrupt", mapping={"record": "{not json", "status": "status_running"})
    redis_client.sadd("sluice:jobs:active", "c-corrupt")

    placement.reconcile(now=T0)

    assert store.state("b-good").nodes == ["celery@a"]


def test_an_unreadable_heartbeat_is_ignored_and_the_other_nodes_stay_live(
    placement: Placement, redis_client: redis.Redis
) -> None:
    placement.heartbeat("celery@a", ["cpu"], now=T0)
    redis_client.hset(NODES_KEY, "celery@garbled", "{not json")
    redis_client.hset(NODES_KEY, "celery@no-time", json.dumps({"queues": ["cpu"], "seen": "yesterday"}))

    assert placement.live_nodes(T0) == {"celery@a": ["cpu"]}
    placement.reconcile(now=T0)


def test_a_restarting_node_finds_the_queues_of_the_active_jobs_placed_on_it(
    placement: Placement, store: JobStore
) -> None:
    store.set_nodes(submit(store, "mine").job_id, ["celery@a", "celery@b"])
    store.set_nodes(submit(store, "theirs").job_id, ["celery@b"])
    ended = submit(store, "ended")
    store.set_nodes(ended.job_id, ["celery@a"])
    store.transition("ended", JobStatus.STOPPED, now=T0)

    assert placement.assigned_queues("celery@a") == ["job.mine"]
