"""Settings of a Sluice deployment, read once from `SLUICE_*` environment variables.

Every process (API, worker, beat, CLI) builds one `Settings` at start and passes it down, so no
module reads the environment on its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from predictors_runtime.errors import ConfigError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as e:
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from e
    if value <= 0:
        raise ConfigError(f"{name}: must be greater than 0, got {raw!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """What every Sluice process needs to find Redis, storage and its timings."""

    redis_url: str = DEFAULT_REDIS_URL
    storage: str = str(Path.home() / ".sluice" / "storage")
    cache_dir: str = str(Path.home() / ".sluice" / "cache")
    # Longest time a single batch may run before Redis hands its message to another worker.
    visibility_timeout_s: float = 3600.0
    # How often beat checks timeouts and job placement.
    beat_interval_s: float = 5.0
    # A worker node whose heartbeat is older than this is considered gone.
    node_ttl_s: float = 15.0
    heartbeat_interval_s: float = 2.0
    # Finished job records are kept this long.
    job_ttl_s: float = 7 * 24 * 3600.0
    max_body_bytes: int = 10 * 1024 * 1024
    # Batches a worker node reserves at a time (Celery's prefetch multiplier; 2 measured no better).
    prefetch_multiplier: int = 1
    # Longest a worker's wait on Redis lasts: a job queue assigned to a node is consumed at most
    # this long after (kombu's BRPOP timeout; an idle node sends one command per interval).
    broker_poll_interval_s: float = 0.1
    # A job still enqueueing whose enqueuer (a thread of an API process) has shown no progress for
    # this long is failed by beat: its API process died, and nothing else would ever finish it.
    enqueue_stale_s: float = 60.0
    # How often live reloading looks for changed models.
    model_poll_interval_s: float = 10.0
    # Local folders that job inputs and outputs may name; none by default.
    local_input_roots: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Read `SLUICE_*` variables; anything unset keeps its default."""
        env = os.environ if env is None else env
        defaults = cls()
        return cls(
            redis_url=env.get("SLUICE_REDIS_URL") or defaults.redis_url,
            storage=env.get("SLUICE_STORAGE") or defaults.storage,
            cache_dir=env.get("SLUICE_CACHE_DIR") or defaults.cache_dir,
            visibility_timeout_s=_number(env, "SLUICE_VISIBILITY_TIMEOUT", defaults.visibility_timeout_s),
            beat_interval_s=_number(env, "SLUICE_BEAT_INTERVAL", defaults.beat_interval_s),
            node_ttl_s=_number(env, "SLUICE_NODE_TTL", defaults.node_ttl_s),
            heartbeat_interval_s=_number(env, "SLUICE_HEARTBEAT_INTERVAL", defaults.heartbeat_interval_s),
            job_ttl_s=_number(env, "SLUICE_JOB_TTL", defaults.job_ttl_s),
            max_body_bytes=int(_number(env, "SLUICE_MAX_BODY_BYTES", defaults.max_body_bytes)),
            prefetch_multiplier=int(_number(env, "SLUICE_WORKER_PREFETCH", defaults.prefetch_multiplier)),
            broker_poll_interval_s=_number(env, "SLUICE_BROKER_POLL_INTERVAL", defaults.broker_poll_interval_s),
            enqueue_stale_s=_number(env, "SLUICE_ENQUEUE_STALE_AFTER", defaults.enqueue_stale_s),
            model_poll_interval_s=_number(env, "SLUICE_MODEL_POLL_INTERVAL", defaults.model_poll_interval_s),
            local_input_roots=tuple(
                root for root in (env.get("SLUICE_LOCAL_INPUT_ROOTS") or "").split(os.pathsep) if root
            ),
        )
