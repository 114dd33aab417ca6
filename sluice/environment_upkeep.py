"""A host's upkeep of its API environments: built before they are needed, removed once no one needs them.

A worker host (`sluice workers`, and so `sluice up`) builds the environment of every deployed
API its queues serve as soon as it sees the deployment, one at a time on a thread of its own,
so that a job's first batch finds it built (and `sluice deploy` can show the build). A host of
either kind removes, every turn, the environments that no deployed API and no active job names
and that nothing on the host has used for the grace (`SLUICE_ENVIRONMENT_GRACE_S`), then prunes
uv's cache (`HostEnvironments.prune`). A running job keeps the environment it started with even
after its API was redeployed with other requirements.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import redis

from foundation.api_kinds import WORKER_KINDS
from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.errors import JobNotFound, SluiceError
from jobs.batch.job import ACTIVE_STATUSES, BAD_RECORD_ERRORS
from jobs.store import JobRecords
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig
from predictors_runtime.environments import EnvironmentSpec, HostEnvironments

log = logging.getLogger(__name__)

# Seconds between two looks at what is deployed; a failed build is tried again this long after it failed.
EVERY_S = 15.0
RETRY_FAILED_S = 300.0


def keys_in_use(apis: Iterable[DeployedApi], store: JobRecords) -> set[str]:
    """The environment keys of every deployed API and of every active job (it keeps the one it started with)."""
    keys = {str(api.environment["key"]) for api in apis if api.environment}
    for job_id in store.active_ids():
        try:
            state = store.state(job_id)
        except JobNotFound:
            continue
        except BAD_RECORD_ERRORS:
            log.exception("environment upkeep: skipping job %s, whose record could not be read", job_id)
            continue
        if state.status in ACTIVE_STATUSES and state.job.environment:
            keys.add(str(state.job.environment["key"]))
    return keys


class EnvironmentUpkeep:
    """One host's turn of upkeep (`step(now)`), building at most one environment at a time on a thread."""

    def __init__(self, environments: HostEnvironments, registry: ApiRegistry, store: JobRecords, *,
                 grace_s: float, bundles: BundleStore | None = None, queues: Iterable[str] = (),
                 every_s: float | None = None) -> None:
        """`bundles` and `queues`: build ahead the environments of the deployed APIs of these queues
        (a worker host); without them only remove (a replica host, whose launchers build their own)."""
        self._environments = environments
        self._registry = registry
        self._store = store
        self._grace_s = grace_s
        self._bundles = bundles
        self._queues = set(queues)
        self._every_s = every_s if every_s is not None else min(EVERY_S, max(grace_s / 4, 1.0))
        self._next = 0.0
        self._failed: dict[str, float] = {}  # key -> when its build failed here
        self._building: threading.Thread | None = None

    @property
    def building(self) -> bool:
        return self._building is not None and self._building.is_alive()

    def step(self, now: float) -> None:
        if now < self._next:
            return
        self._next = now + self._every_s
        try:
            apis = self._registry.all()
            keep = keys_in_use(apis, self._store)
        except (redis.RedisError, SluiceError, ValueError) as e:  # Redis away, a bad record: remove nothing on a guess
            log.warning("environment upkeep skipped: %s", e)
            return
        if self.building:
            return
        try:
            self._environments.prune(keep, time.time(), self._grace_s)
        except (OSError, SluiceError) as e:  # a folder that cannot be removed now: the next turn tries again
            log.warning("removing unused environments failed: %s", e)
        self._build_next(apis, now)

    def _build_next(self, apis: list[DeployedApi], now: float) -> None:
        if self._bundles is None:
            return
        for api in apis:
            if not api.environment or api.kind not in WORKER_KINDS or api.queue not in self._queues:
                continue
            spec = EnvironmentSpec.from_dict(api.environment)
            if self._environments.get(spec.key) is not None or now - self._failed.get(spec.key, -1e18) < RETRY_FAILED_S:
                continue
            self._building = threading.Thread(target=self._build, args=(api, spec), daemon=True,
                                              name=f"environment-{spec.key}")
            self._building.start()
            return

    def _build(self, api: DeployedApi, spec: EnvironmentSpec) -> None:
        assert self._bundles is not None
        try:
            folder = self._bundles.local_folder(api.bundle)
        except (SluiceError, OSError) as e:
            log.warning("environment %s of api %s: its bundle could not be fetched: %s", spec.key, api.name, e)
            self._failed[spec.key] = time.time()
            return
        try:
            log.info("building environment %s of api %s ahead of its first batch", spec.key, api.name,
                     extra={"environment": spec.key, "api": api.name})
            self._environments.ensure_for(spec, folder, ApiConfig.from_dict(api.spec))
        except SluiceError as e:
            log.error("environment %s of api %s could not be built: %s", spec.key, api.name, e.message,
                      extra={"environment": spec.key, "api": api.name})
            self._failed[spec.key] = time.time()
        finally:
            self._bundles.release(api.bundle)
