"""The connected parts every Sluice process uses, typed by what they do, not by which backend does it.

`Services.connect` builds the Redis ones from `Settings` (contacting Redis lazily, on first use);
a process does that once, at its wiring point (`jobs/wiring.py`). Fast tests build `Services` from
the in-memory fakes instead (`MemoryJobStore`, `MemoryNodes`, `MemoryJobQueues`), which pass the
same contract tests as the Redis parts.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from foundation.acknowledgements import Acknowledgements, RedisAcknowledgements
from foundation.api_registry import RedisApiRegistry
from foundation.hosts import RedisHostDirectory
from foundation.idempotency import IdempotencyKeys, RedisIdempotencyKeys
from foundation.redis_clients import connect
from foundation.replica_placement import RedisReplicaAssignments
from foundation.replica_scale import RedisScaleBook
from foundation.settings import Settings
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.store import AsyncRequestStore, RedisAsyncRequests
from jobs.nodes.registry import NodeRegistry, Nodes
from jobs.nodes.worker_hosts import RedisWorkerHosts, WorkerHosts
from jobs.placement.asyncapi import AsyncPlacement, RedisAsyncAssignments
from jobs.placement.batch import JobPlacement, Placement
from jobs.placement.realtime import RealtimePlacement
from jobs.store import JobStorage, JobStore
from jobs.transport.queues import CeleryJobQueues, JobQueues
from jobs.transport.task_messages import TaskMessages
from predictors_runtime.bundles import BundleStore
from predictors_runtime.project import BundleLimits


@dataclass
class Services:
    """One process's connected parts. `redis` is the client the API's own registries use."""

    settings: Settings
    celery: Celery
    redis: redis.Redis
    store: JobStorage
    nodes: NodeRegistry
    placement: JobPlacement
    bundles: BundleStore
    queues: JobQueues
    # AsyncAPI requests' records: made on first use from `redis` unless given (fast tests give a fake).
    requests: AsyncRequestStore | None = None
    # Worker hosts' reports and beat's plan for them: made on first use from `redis` unless given.
    worker_host_store: WorkerHosts | None = None
    # Task messages made without Celery's publishing path: made on first use from `celery`.
    task_message_maker: TaskMessages | None = None
    # Replicas' confirmation of what is answered, and submissions' idempotency keys: made on first
    # use from `redis` unless given (fast tests give the fakes of foundation/memory.py).
    acks: Acknowledgements | None = None
    idempotency_keys: IdempotencyKeys | None = None

    @property
    def acknowledgements(self) -> Acknowledgements:
        """Waits until Redis's replicas have what this process wrote (`foundation/acknowledgements.py`)."""
        if self.acks is None:
            self.acks = RedisAcknowledgements(self.redis, self.settings.acknowledgements)
        return self.acks

    @property
    def idempotency(self) -> IdempotencyKeys:
        """The claims of submissions' `Idempotency-Key`s (`foundation/idempotency.py`)."""
        if self.idempotency_keys is None:
            self.idempotency_keys = RedisIdempotencyKeys(self.redis)
        return self.idempotency_keys

    @property
    def task_messages(self) -> TaskMessages:
        """Celery's messages of a task, made to be queued by a Redis script (`jobs/transport/task_messages.py`);
        the broker is `redis` (one `SLUICE_REDIS_URL` for both)."""
        if self.task_message_maker is None:
            self.task_message_maker = TaskMessages(self.celery)
        return self.task_message_maker

    @property
    def worker_hosts(self) -> WorkerHosts:
        """What worker hosts run, beat's plan for them and the jobs' notes (`jobs/nodes/worker_hosts.py`)."""
        if self.worker_host_store is None:
            self.worker_host_store = RedisWorkerHosts(self.redis)
        return self.worker_host_store

    @property
    def async_requests(self) -> AsyncRequestStore:
        """The records of AsyncAPI requests (`jobs/asyncapi/store.py`)."""
        if self.requests is None:
            self.requests = RedisAsyncRequests(self.redis, self.settings.async_retention_s)
        return self.requests

    @property
    def async_placement(self) -> AsyncPlacement:
        """Which nodes serve each AsyncAPI (`jobs/placement/asyncapi.py`)."""
        return AsyncPlacement(RedisApiRegistry(self.redis), self.async_requests, RedisAsyncAssignments(self.redis),
                              self.queues, self.nodes, self.placement.load)

    @property
    def realtime_placement(self) -> RealtimePlacement:
        """Where each RealtimeAPI's replicas run (`jobs/placement/realtime.py`)."""
        return RealtimePlacement(RedisApiRegistry(self.redis), RedisHostDirectory(self.redis),
                                 RedisScaleBook(self.redis), RedisReplicaAssignments(self.redis),
                                 self.settings.host_ttl_s, worker_hosts=self.worker_hosts)

    @property
    def request_objects(self) -> RequestObjects:
        """Where AsyncAPI payloads and results are stored (`jobs/asyncapi/objects.py`)."""
        return RequestObjects(self.settings.storage)

    @classmethod
    def connect(cls, settings: Settings, celery: Celery) -> Services:
        """Build the Redis clients and the parts over them; Redis is contacted lazily, on first use."""
        client = connect(settings.redis_address, settings.redis_retry_s, health_check_interval=30)  # rides out stalls
        store = JobStore(client, job_ttl_s=settings.job_ttl_s)
        nodes = Nodes(client, node_ttl_s=settings.node_ttl_s)
        queues = CeleryJobQueues(celery)
        return cls(
            settings=settings,
            celery=celery,
            redis=client,
            store=store,
            nodes=nodes,
            placement=Placement(queues, store, nodes),
            bundles=BundleStore(
                settings.storage, settings.cache_dir, cache_bytes=settings.bundle_cache_bytes,
                limits=BundleLimits(settings.max_unpacked_bundle_bytes, settings.max_bundle_files),
            ),
            queues=queues,
        )
