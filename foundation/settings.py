"""Settings of a Sluice deployment, read once from `SLUICE_*` environment variables.

Every process (API, worker, beat, CLI) builds one `Settings` at start and passes it down, so no
module reads the environment on its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import api_keys
from .acknowledgements import AckPolicy
from .errors import ConfigError
from .host_pools import VARIABLE as HOST_POOLS_VARIABLE
from .host_pools import HostPool, parse_host_pools
from .hosts import HOST_TTL_S
from .limits import (
    DEFAULT_ASYNC_RETENTION_S,
    DEFAULT_BUNDLE_CACHE_BYTES,
    MAX_BATCH_TIMEOUT_S,
    MAX_BUNDLE_FILES,
    MAX_UNPACKED_BYTES,
)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
SENTINELS_VARIABLE = "SLUICE_REDIS_SENTINELS"


@dataclass(frozen=True)
class RedisTls:
    """TLS to Redis: the CA its servers' certificates are checked against (None: the system's), and
    this client's own certificate and key when the servers ask for one (`tls-auth-clients`).

    A `rediss://` URL turns it on; with sentinels, `SLUICE_REDIS_TLS=1` does (the sentinels, the
    primary and its replicas then all speak TLS, as `tls-replication yes` sets them up).
    """

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def redis_py(self) -> dict[str, Any]:
        """redis-py's keyword arguments of an SSL connection: the certificate is always checked."""
        options: dict[str, Any] = {"ssl_cert_reqs": "required"}
        for name, value in (("ssl_ca_certs", self.ca), ("ssl_certfile", self.cert), ("ssl_keyfile", self.key)):
            if value:
                options[name] = value
        return options


@dataclass(frozen=True)
class RedisAddress:
    """Where a process finds Redis: a URL, or the primary that Redis Sentinel names.

    With `sentinels` set, every client asks them which server is the primary of `master` (and
    asks again after a failover) and `url` is unused; `foundation/redis_clients.py` builds both
    kinds, `jobs/transport/broker.py` the broker's URL. The passwords are kept out of repr and logs.
    """

    url: str = DEFAULT_REDIS_URL
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = ""
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    # TLS to every Redis connection (`rediss://`, or sentinels with SLUICE_REDIS_TLS=1); None: plain TCP.
    tls: RedisTls | None = None

    def __str__(self) -> str:
        """For messages: the sentinels and master, or the URL without its password."""
        if self.sentinels:
            return f"the primary {self.master!r} of the sentinels " + ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return _without_password(self.url)


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    return f"{scheme}{sep}{'***@' if credentials else ''}{location}" if at else url


def _sentinels(env: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """`host:port,host:port,...` (an IPv6 host in brackets), each port 1-65535."""
    raw = env.get(SENTINELS_VARIABLE) or ""
    found: list[tuple[str, int]] = []
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        host, colon, port = entry.rpartition(":")
        host = host.strip("[]")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{SENTINELS_VARIABLE}: expected host:port[,host:port...], got {entry!r} in {raw!r}")
        found.append((host, int(port)))
    return tuple(found)


def redis_address_from_env(env: Mapping[str, str]) -> RedisAddress:
    """The Redis settings, checked together: sentinels want a master name, and exclude a URL."""
    sentinels = _sentinels(env)
    master = (env.get("SLUICE_REDIS_MASTER") or "").strip()
    url = env.get("SLUICE_REDIS_URL") or ""
    sentinel_password = env.get("SLUICE_REDIS_SENTINEL_PASSWORD") or None
    if sentinels and not master:
        raise ConfigError(f"{SENTINELS_VARIABLE} is set: SLUICE_REDIS_MASTER must name the primary the sentinels watch")
    if sentinels and url:
        raise ConfigError(f"SLUICE_REDIS_URL and {SENTINELS_VARIABLE} are both set: set one (the sentinels "
                          "find the primary)")
    if not sentinels and (master or sentinel_password):
        unused = "SLUICE_REDIS_MASTER" if master else "SLUICE_REDIS_SENTINEL_PASSWORD"
        raise ConfigError(f"{unused} is set but {SENTINELS_VARIABLE} is not: list the sentinels as host:port,...")
    return RedisAddress(url=url or DEFAULT_REDIS_URL, sentinels=sentinels, master=master,
                        password=env.get("SLUICE_REDIS_PASSWORD") or None, sentinel_password=sentinel_password,
                        tls=_redis_tls(env, url, sentinels))


TLS_VARIABLES = ("SLUICE_REDIS_CA", "SLUICE_REDIS_CERT", "SLUICE_REDIS_KEY")


def _redis_tls(env: Mapping[str, str], url: str, sentinels: tuple[tuple[str, int], ...]) -> RedisTls | None:
    """TLS to Redis when the URL is `rediss://` or the sentinels are said to speak it; its files checked."""
    ca, cert, key = (env.get(name) or None for name in TLS_VARIABLES)
    wanted = url.startswith("rediss://") if not sentinels else env.get("SLUICE_REDIS_TLS", "") in ("1", "true", "yes")
    if not wanted:
        if ca or cert or key:
            raise ConfigError("SLUICE_REDIS_CA/CERT/KEY are set but Redis is not reached over TLS: use a rediss:// "
                              "SLUICE_REDIS_URL (or SLUICE_REDIS_TLS=1 with sentinels)")
        return None
    if (cert is None) != (key is None):
        raise ConfigError("SLUICE_REDIS_CERT and SLUICE_REDIS_KEY go together (a client certificate and its key)")
    for name, path in zip(TLS_VARIABLES, (ca, cert, key), strict=True):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{name}: {path} is not a file")
    return RedisTls(ca, cert, key)


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


def _ack_policy(env: Mapping[str, str]) -> AckPolicy:
    try:
        return AckPolicy.parse(env.get("SLUICE_ACK_REPLICAS"), env.get("SLUICE_ACK_TIMEOUT_MS"))
    except ValueError as e:
        raise ConfigError(str(e)) from e


def _time_limit(env: Mapping[str, str], name: str) -> float | None:
    """Seconds, or None when unset; bounded like the job field it is the default of."""
    if not env.get(name):
        return None
    value = _number(env, name, 0.0)
    if value > MAX_BATCH_TIMEOUT_S:
        raise ConfigError(f"{name}: must be at most {MAX_BATCH_TIMEOUT_S} seconds, got {env[name]!r}")
    return value


@dataclass(frozen=True)
class Settings:
    """What every Sluice process needs to find Redis, storage and its timings."""

    redis_url: str = DEFAULT_REDIS_URL
    # Redis Sentinel (`SLUICE_REDIS_SENTINELS`, `SLUICE_REDIS_MASTER`) and the passwords: with
    # sentinels set, `redis_url` is unused (see `redis_address`).
    redis_sentinels: tuple[tuple[str, int], ...] = ()
    redis_master: str = ""
    redis_password: str | None = field(default=None, repr=False)
    redis_sentinel_password: str | None = field(default=None, repr=False)
    redis_tls: RedisTls | None = None
    storage: str = str(Path.home() / ".sluice" / "storage")
    cache_dir: str = str(Path.home() / ".sluice" / "cache")
    # Longest time a single batch may run before Redis hands its message to another worker.
    visibility_timeout_s: float = 3600.0
    # How often beat checks timeouts and job placement.
    beat_interval_s: float = 5.0
    # A worker node whose heartbeat is older than this is considered gone.
    node_ttl_s: float = 15.0
    heartbeat_interval_s: float = 2.0
    # A host (`sluice replicas`, `sluice workers`, `sluice up`) silent for this long is no longer
    # offered to placement, and what it ran is placed on the others.
    host_ttl_s: float = HOST_TTL_S
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
    # How long a Redis call is repeated (with backoff) while Redis stalls or restarts, before the
    # caller gives up (foundation/redis_clients.py).
    redis_retry_s: float = 30.0
    # A worker node that has taken nothing for this long while its queues held messages ends
    # itself, to be restarted on a fresh connection (jobs/nodes/stall_watch.py).
    worker_stall_s: float = 60.0
    # How often live reloading looks for changed models.
    model_poll_interval_s: float = 10.0
    # Seconds one try of a batch may run when neither the job nor its API says (None: no limit).
    batch_timeout_s: float | None = None
    # How long past a batch's time limit the kernel ends a node whose watchdog thread could not
    # run (a predictor holding the GIL; jobs/batch/time_limit.py).
    hard_stop_grace_s: float = 5.0
    # Local folders that job inputs and outputs may name; none by default.
    local_input_roots: tuple[str, ...] = ()
    # What one deployed project may unpack to, and the unpacked bundles a host's cache keeps.
    max_unpacked_bundle_bytes: int = MAX_UNPACKED_BYTES
    max_bundle_files: int = MAX_BUNDLE_FILES
    bundle_cache_bytes: int = DEFAULT_BUNDLE_CACHE_BYTES
    # API keys callers must present (foundation/api_keys.py); none: anonymous. Kept out of repr and logs.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # Each key's role (`admin` or `invoke`); a key not named here is `admin`. Kept out of repr and logs.
    key_roles: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False, hash=False)
    # The proxy asks realtime APIs' callers for a key too (only with keys set).
    protect_realtime: bool = False
    # Listening beyond loopback without keys is allowed (otherwise refused at start).
    allow_anonymous: bool = False
    # Log lines kept per job (and per realtime API) in Redis for `sluice logs`, and how long a
    # log stream is kept after its last line (foundation/log_streams.py).
    log_lines: int = 10_000
    log_retention_s: float = 7 * 24 * 3600.0
    # How long an AsyncAPI request (its record, payload and result) is kept after its last change.
    async_retention_s: float = DEFAULT_ASYNC_RETENTION_S
    # Where a project's requirements are resolved from at deploy (and installed from on every host):
    # an index in place of PyPI, folders or pages of wheels, and whether to use no index at all.
    package_index_url: str | None = None
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    # How long an environment no deployed API or active job uses stays on a host before it is removed.
    environment_grace_s: float = 3600.0
    # Celery's task events, for Flower or `celery events`: off, as each costs a message per task.
    task_events: bool = False
    # The host pools something outside Sluice scales (KEDA on Kubernetes): beat publishes how many
    # hosts each one wants (`foundation/host_pools.py`).
    host_pools: tuple[HostPool, ...] = ()
    # How many Redis replicas must confirm a write before Sluice answers it, and for how long
    # (foundation/acknowledgements.py): the default waits for every replica the primary reports.
    acknowledgements: AckPolicy = field(default_factory=AckPolicy)

    @property
    def redis_address(self) -> RedisAddress:
        """Where this deployment's Redis is: what every client and the broker are built from."""
        return RedisAddress(self.redis_url, self.redis_sentinels, self.redis_master, self.redis_password,
                            self.redis_sentinel_password, self.redis_tls)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read `SLUICE_*` variables; anything unset keeps its default."""
        env = os.environ if env is None else env
        defaults = cls()
        redis_address = redis_address_from_env(env)
        return cls(
            redis_url=redis_address.url,
            redis_sentinels=redis_address.sentinels,
            redis_master=redis_address.master,
            redis_password=redis_address.password,
            redis_sentinel_password=redis_address.sentinel_password,
            redis_tls=redis_address.tls,
            storage=env.get("SLUICE_STORAGE") or defaults.storage,
            cache_dir=env.get("SLUICE_CACHE_DIR") or defaults.cache_dir,
            visibility_timeout_s=_number(env, "SLUICE_VISIBILITY_TIMEOUT", defaults.visibility_timeout_s),
            beat_interval_s=_number(env, "SLUICE_BEAT_INTERVAL", defaults.beat_interval_s),
            node_ttl_s=_number(env, "SLUICE_NODE_TTL", defaults.node_ttl_s),
            heartbeat_interval_s=_number(env, "SLUICE_HEARTBEAT_INTERVAL", defaults.heartbeat_interval_s),
            host_ttl_s=_number(env, "SLUICE_HOST_TTL", defaults.host_ttl_s),
            job_ttl_s=_number(env, "SLUICE_JOB_TTL", defaults.job_ttl_s),
            max_body_bytes=int(_number(env, "SLUICE_MAX_BODY_BYTES", defaults.max_body_bytes)),
            prefetch_multiplier=int(_number(env, "SLUICE_WORKER_PREFETCH", defaults.prefetch_multiplier)),
            broker_poll_interval_s=_number(env, "SLUICE_BROKER_POLL_INTERVAL", defaults.broker_poll_interval_s),
            enqueue_stale_s=_number(env, "SLUICE_ENQUEUE_STALE_AFTER", defaults.enqueue_stale_s),
            model_poll_interval_s=_number(env, "SLUICE_MODEL_POLL_INTERVAL", defaults.model_poll_interval_s),
            redis_retry_s=_number(env, "SLUICE_REDIS_RETRY_S", defaults.redis_retry_s),
            worker_stall_s=_number(env, "SLUICE_WORKER_STALL_S", defaults.worker_stall_s),
            batch_timeout_s=_time_limit(env, "SLUICE_BATCH_TIMEOUT"),
            hard_stop_grace_s=_number(env, "SLUICE_HARD_STOP_GRACE_S", defaults.hard_stop_grace_s),
            local_input_roots=tuple(
                root for root in (env.get("SLUICE_LOCAL_INPUT_ROOTS") or "").split(os.pathsep) if root
            ),
            max_unpacked_bundle_bytes=int(
                _number(env, "SLUICE_MAX_UNPACKED_BUNDLE_BYTES", defaults.max_unpacked_bundle_bytes)
            ),
            max_bundle_files=int(_number(env, "SLUICE_MAX_BUNDLE_FILES", defaults.max_bundle_files)),
            bundle_cache_bytes=int(_number(env, "SLUICE_BUNDLE_CACHE_BYTES", defaults.bundle_cache_bytes)),
            api_keys=api_keys.load_api_keys(env),
            key_roles=api_keys.load_key_roles(env),
            protect_realtime=api_keys.flag(env, api_keys.PROTECT_REALTIME_VARIABLE),
            allow_anonymous=api_keys.flag(env, api_keys.ALLOW_ANONYMOUS_VARIABLE),
            log_lines=int(_number(env, "SLUICE_LOG_LINES", defaults.log_lines)),
            log_retention_s=_number(env, "SLUICE_LOG_RETENTION_S", defaults.log_retention_s),
            async_retention_s=_number(env, "SLUICE_ASYNC_RETENTION_S", defaults.async_retention_s),
            package_index_url=env.get("SLUICE_PACKAGE_INDEX_URL") or None,
            find_links=tuple(link for link in (env.get("SLUICE_FIND_LINKS") or "").split(",") if link.strip()),
            no_index=api_keys.flag(env, "SLUICE_NO_INDEX"),
            environment_grace_s=_number(env, "SLUICE_ENVIRONMENT_GRACE_S", defaults.environment_grace_s),
            task_events=api_keys.flag(env, "SLUICE_TASK_EVENTS"),
            host_pools=parse_host_pools(env.get(HOST_POOLS_VARIABLE)),
            acknowledgements=_ack_policy(env),
        )
