"""The connected parts every Sluice process uses, built once from `Settings`."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from predictors_runtime.bundles import BundleStore
from predictors_runtime.project import BundleLimits

from .nodes import Nodes
from .placement import Placement
from foundation.redis_clients import connect
from foundation.settings import Settings
from .store import JobStore


@dataclass
class Services:
    settings: Settings
    celery: Celery
    redis: redis.Redis
    store: JobStore
    nodes: Nodes
    placement: Placement
    bundles: BundleStore

    @classmethod
    def connect(cls, settings: Settings, celery: Celery) -> "Services":
        """Build the clients; Redis is contacted lazily, on first use."""
        client = connect(settings.redis_url, settings.redis_retry_s, health_check_interval=30)  # rides out stalls
        store = JobStore(client, job_ttl_s=settings.job_ttl_s)
        nodes = Nodes(client, celery, node_ttl_s=settings.node_ttl_s)
        return cls(
            settings=settings,
            celery=celery,
            redis=client,
            store=store,
            nodes=nodes,
            placement=Placement(celery, store, client, node_ttl_s=settings.node_ttl_s, nodes=nodes),
            bundles=BundleStore(
                settings.storage, settings.cache_dir, cache_bytes=settings.bundle_cache_bytes,
                limits=BundleLimits(settings.max_unpacked_bundle_bytes, settings.max_bundle_files),
            ),
        )
