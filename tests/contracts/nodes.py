"""The node registry's contract (`jobs.nodes.registry.NodeRegistry`): heartbeats and in-flight deliveries.

Fixtures a subclass provides: `nodes` (empty, with a node TTL of `NODE_TTL_S`) and `store` (an empty
job store whose batch ledger writes the same in-flight hashes `nodes` reads). Run against the
in-memory registry in tests/unit/test_nodes_contract.py, and against Redis's and the in-memory one
in tests/integration/test_nodes_redis.py.
"""

from __future__ import annotations

from jobs.batch.job import Job, JobStatus
from jobs.nodes.registry import NodeRegistry, jobs_held, silent_too_long
from jobs.store import JobStorage
from jobs.transport.delivery import COMPLETION_ENTRY, Delivery, inflight_entry

T0 = 1_700_000_000.0
NODE_TTL_S = 15.0


def running_job(store: JobStorage, job_id: str) -> Job:
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=3, start_time=T0)
    store.create(job, JobStatus.RUNNING)
    return job


class NodeRegistryContract:
    # -- heartbeats -----------------------------------------------------------------------------
    def test_a_node_is_live_while_its_heartbeat_is_younger_than_the_node_ttl(self, nodes: NodeRegistry) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        nodes.heartbeat("celery@b", ["gpu"], now=T0 - 10)

        assert nodes.live(T0) == {"celery@a": ["cpu"], "celery@b": ["gpu"]}
        assert nodes.live(T0 + NODE_TTL_S - 10) == {"celery@a": ["cpu"], "celery@b": ["gpu"]}
        assert nodes.live(T0 + NODE_TTL_S) == {"celery@a": ["cpu"]}
        assert nodes.live(T0 + NODE_TTL_S + 0.1) == {}

    def test_a_fresh_heartbeat_brings_a_silent_node_back(self, nodes: NodeRegistry) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        assert nodes.live(T0 + 60) == {}

        nodes.heartbeat("celery@a", ["cpu"], now=T0 + 59)

        assert nodes.live(T0 + 60) == {"celery@a": ["cpu"]}

    def test_a_node_silent_for_long_is_dropped_from_the_registry(self, nodes: NodeRegistry) -> None:
        nodes.heartbeat("celery@gone", ["cpu"], now=T0)
        nodes.heartbeat("celery@quiet", ["cpu"], now=T0 + 100)

        assert nodes.live(T0 + 20 * NODE_TTL_S + 1) == {}

        assert list(nodes.heartbeats()) == ["celery@quiet"]

    def test_a_node_that_says_goodbye_is_no_longer_live(self, nodes: NodeRegistry) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)

        nodes.forget("celery@a")

        assert nodes.live(T0) == {} and nodes.heartbeats() == {}

    def test_job_queues_a_node_consumes_are_not_counted_as_its_hardware_queues(self, nodes: NodeRegistry) -> None:
        nodes.heartbeat("celery@a", ["job.0018bcfe5680", "cpu", "sluice.maintenance", "job.x"], now=T0)

        assert nodes.live(T0) == {"celery@a": ["cpu", "sluice.maintenance"]}
        assert nodes.heartbeats() == {"celery@a": {"queues": ["cpu", "sluice.maintenance"], "seen": T0}}

    def test_a_node_gone_from_the_registry_or_silent_for_long_has_its_deliveries_given_back(
        self, nodes: NodeRegistry
    ) -> None:
        nodes.heartbeat("celery@a", ["cpu"], now=T0)
        heartbeats = nodes.heartbeats()

        assert not silent_too_long("celery@a", T0 + 4 * NODE_TTL_S, heartbeats, nodes.node_ttl_s)
        assert silent_too_long("celery@a", T0 + 4 * NODE_TTL_S + 0.1, heartbeats, nodes.node_ttl_s)
        assert silent_too_long("celery@never", T0, heartbeats, nodes.node_ttl_s)

    # -- in-flight deliveries -------------------------------------------------------------------
    def test_a_batch_enters_its_nodes_in_flight_hash_as_it_begins_and_leaves_it_once_recorded(
        self, nodes: NodeRegistry, store: JobStorage
    ) -> None:
        job = running_job(store, "job-e")
        delivery = Delivery("busy@host", "task-1")

        store.begin_batch(job.job_id, 0, delivery)
        assert nodes.inflight("busy@host") == {"task-1": "job-e:0"}
        assert nodes.inflight_nodes() == ["busy@host"]
        store.record_success(job.job_id, 0, 0.1, delivery)

        assert nodes.inflight("busy@host") == {} and nodes.inflight_nodes() == []

    def test_a_batch_recorded_already_or_of_an_ended_job_is_not_entered(
        self, nodes: NodeRegistry, store: JobStorage
    ) -> None:
        job = running_job(store, "job-f")
        store.record_success(job.job_id, 0, 0.1)
        store.begin_batch(job.job_id, 0, Delivery("busy@host", "task-dup"))
        store.transition(job.job_id, JobStatus.STOPPED)
        store.begin_batch(job.job_id, 1, Delivery("busy@host", "task-late"))

        assert nodes.inflight("busy@host") == {}

    def test_a_completion_is_entered_and_taken_off_by_the_registry_itself(self, nodes: NodeRegistry) -> None:
        delivery = Delivery("node@a", "task-9")

        nodes.begin_delivery(delivery, inflight_entry("job-1", COMPLETION_ENTRY))
        assert nodes.inflight("node@a") == {"task-9": "job-1:complete"}
        nodes.end_delivery(delivery)

        assert nodes.inflight("node@a") == {}

    def test_deliveries_are_forgotten_by_task_id_and_each_nodes_jobs_are_read_from_its_entries(
        self, nodes: NodeRegistry
    ) -> None:
        for task_id, entry in [("t1", "job-1:0"), ("t2", "job-1:3"), ("t3", "job-2:complete")]:
            nodes.begin_delivery(Delivery("node@a", task_id), entry)
        nodes.begin_delivery(Delivery("node@b", "t4"), "job-3:1")

        assert jobs_held(nodes, ["node@a", "node@b", "node@c"]) == {
            "node@a": {"job-1", "job-2"}, "node@b": {"job-3"}, "node@c": set()}
        nodes.forget_inflight("node@a", ["t1", "t3", "never"])
        nodes.forget_inflight("node@a", [])

        assert nodes.inflight("node@a") == {"t2": "job-1:3"}
        assert nodes.inflight_nodes() == ["node@a", "node@b"]
