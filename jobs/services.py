"""The connected parts every Sluice process uses, built once from `Settings`."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from predictors_runtime.bundles import BundleStore

from .placement import Placement
from .settings import Settings
from .store import JobStore


@dataclass
class Services:
    settings: Settings
    celery: Celery
    redis: redis.Redis
    store: JobStore
    placement: Placement
    bundles: BundleStore

    @classmethod
    def connect(cls, settings: Settings, celery: Celery) -> "Services":
        """Build the clients; Redis is contacted lazily, on first use."""
        client = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
        store = JobStore(client, job_ttl_s=settings.job_ttl_s)
        return cls(
            settings=settings,
            celery=celery,
            redis=client,
            store=store,
            placement=Placement(celery, store, client, node_ttl_s=settings.node_ttl_s),
            bundles=BundleStore(settings.storage, settings.cache_dir),
        )
