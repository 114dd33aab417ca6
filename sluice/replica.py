"""`sluice serve`: the replica of one realtime API on this host, kept running and rolled on redeploys.

The launcher owns one gunicorn at a time per deployment of the API (a "generation"): it fetches
the deployment's bundle, writes the replica's state folder (the spec as JSON, a folder for the
readiness markers), starts gunicorn on `api.realtime:create_replica_app()` with the project
folder as working directory and the project's `.env` and `predictor.env` in its environment, and
announces it in Redis every heartbeat, so that the proxy routes to it once every process has
built the predictor.

A redeploy (the registry's bundle or spec changes) is rolled without a gap: the new generation
starts on the other of two ports (P, P+1), is announced as a new replica, and only once it is
ready is the old one marked draining; the old gunicorn gets SIGTERM (it finishes the requests it
has) once no proxy routes to it any more, or after a cap. A gunicorn that dies is started again
on the same port. The API deleted, or SIGTERM to the launcher, stops everything and removes the
records.

The loop is a single `step(now)`, so its decisions can be driven by tests; processes, Redis and
the proxy's routing table are the only outside state.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import redis

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry, DeployedApi, RedisApiRegistry
from foundation.cpu_limits import CpuGroup, CpuLimits
from foundation.environment_states import RedisEnvironmentStates
from foundation.errors import ApiNotFound, ConfigError, NotReady, SluiceError
from foundation.hosts import cpu_millis, mem_bytes
from foundation.memory_guard import USAGE_FILE_VARIABLE
from foundation.memory_limits import (
    LIMIT_FILE_VARIABLE,
    LimitMode,
    MemoryGroup,
    MemoryLimits,
    human_bytes,
    replica_limit,
)
from foundation.proxy_registry import RedisProxyRegistry, unrouted
from foundation.redis_clients import heartbeat_client
from foundation.replica_directory import ReadinessMarkers, RedisReplicaDirectory, ReplicaDirectory, ReplicaRecord
from foundation.replica_scale import RedisScaleBook, ScaleBook
from foundation.rollout_slots import SURGE, UNAVAILABLE, RedisRolloutSlots, RolloutSlots
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig
from predictors_runtime.environments import HostEnvironments
from predictors_runtime.project import BundleLimits

from .local_socket import host_identity, remove_stale, socket_path_for
from .replica_environment import RETRY_AFTER_S as ENVIRONMENT_RETRY_S
from .replica_environment import BackgroundBuild
from .replica_process import graceful_timeout_s, replica_argv, replica_env, signal_group, spawn_gunicorn
from .tls.hosts import host_tls

log = logging.getLogger("sluice.serve")

DEFAULT_API_URL = "http://127.0.0.1:8888"
TICK_S = 0.25
HEARTBEAT_S = 1.0
# Longest a draining replica waits for the proxies to stop routing it before it is stopped anyway.
DRAIN_CAP_S = 30.0
# A gunicorn that dies again within this many seconds of its start is restarted after a back-off.
QUICK_EXIT_S = 10.0
MAX_RESTART_DELAY_S = 30.0
# A gunicorn that has not finished its requests this long after its graceful timeout is killed.
KILL_AFTER_GRACE_S = 5.0

Unrouted = Callable[[redis.Redis, str, float], bool]


# -- pure pieces ------------------------------------------------------------------------------
def alternate_port(base_port: int, port: int) -> int:
    """The port the next generation uses: P and P+1 take turns, so old and new run side by side."""
    return base_port + 1 if port == base_port else base_port


def deployment_identity(api: DeployedApi) -> str:
    """What a running generation must match: the bundle and the spec (a config-only redeploy rolls too)."""
    spec = json.dumps(api.spec, sort_keys=True, separators=(",", ":"))
    return f"{api.bundle}:{hashlib.sha256(spec.encode()).hexdigest()[:16]}"


def new_replica_id(api_name: str, port: int) -> str:
    """Unique across hosts and generations; only characters a proxy accepts in a server name."""
    return f"{api_name}-{port}-{secrets.token_hex(4)}"


def advertised_address(host: str, advertise: str | None, toward: str | None = None) -> str:
    """The address other hosts reach this one at: `--advertise`, else the bind address.

    For a wildcard bind: what this host's name resolves to, unless that is a loopback address
    (Debian maps the host name to 127.0.1.1) or nothing, which a proxy on another host could not
    use; then the address this host reaches `toward` from (Redis's host, which every Sluice host
    reaches, so the address lies on the network they share).
    """
    if advertise:
        return advertise
    if host not in ("", "0.0.0.0", "::"):
        return host
    try:
        resolved = socket.gethostbyname(socket.gethostname())
    except OSError:
        resolved = ""
    if resolved and not ipaddress.ip_address(resolved).is_loopback:
        return resolved
    return (source_address(toward) if toward else None) or resolved or "127.0.0.1"


def source_address(destination: str) -> str | None:
    """The local address this host sends from to reach `destination` (a UDP connect sends nothing)."""
    try:
        family = socket.AF_INET6 if ":" in destination else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((destination.strip("[]"), 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


def redis_host(client: redis.Redis) -> str | None:
    """The host name or address `client` connects to (None for a unix socket)."""
    host = client.connection_pool.connection_kwargs.get("host")
    return str(host) if host else None


def restart_delay_s(quick_failures: int) -> float:
    """Back-off before starting again a gunicorn that keeps dying at once (0 after a long run)."""
    if quick_failures <= 0:
        return 0.0
    return float(min(MAX_RESTART_DELAY_S, 0.5 * 2 ** (quick_failures - 1)))


def _proxy_unrouted() -> Unrouted:
    """The proxies' answer to "does any proxy still route this replica?" (`foundation/proxy_registry.py`)."""
    return lambda client, replica_id, now: unrouted(RedisProxyRegistry(client).live(now), replica_id)


# -- one gunicorn --------------------------------------------------------------------------------
@dataclass
class Generation:
    """One gunicorn serving one deployment of the API on one port, under one replica id."""

    replica_id: str
    api: DeployedApi
    port: int
    project_dir: Path
    state_dir: Path
    env: dict[str, str]
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float = 0.0
    quick_failures: int = 0
    restarts: int = 0
    message: str = ""
    failing: bool = False             # `message` says what failed, not which step of its start it is at
    draining_since: float | None = None
    drain_now: bool = False           # stop without waiting for the proxies (the API is gone)
    stop_sent_at: float | None = None
    last_announced: tuple[bool, bool, str, float] | None = None
    last_announced_at: float = 0.0
    identity: str = ""
    unix_socket: str = ""             # where it also listens, for a proxy on this host ("" if nowhere)
    tls: bool = False                 # it serves TLS only, with its host's certificate
    # Every process of this gunicorn has been ready at least once (reset when gunicorn restarts).
    has_been_ready: bool = False
    # The API's own environment being built (None: it has none, or it is built and argv runs in it).
    environment: BackgroundBuild | None = None
    environment_used: BackgroundBuild | None = None
    # Its memory limit (foundation/memory_limits.py; None: its API sets no compute.mem, or limits are off),
    # the kills counted so far, and the last one: when, and what it said.
    memory: MemoryGroup | None = None
    cpu: CpuGroup | None = None       # its CPU weight (foundation/cpu_limits.py; None: no cpu controller)
    oom_kills: int = 0
    last_oom_at: float = 0.0
    last_oom: str = ""
    markers: ReadinessMarkers = field(init=False)

    def __post_init__(self) -> None:
        self.markers = ReadinessMarkers(self.state_dir / "markers")
        self.identity = deployment_identity(self.api)

    @property
    def processes(self) -> int:
        return ApiConfig.from_dict(self.api.spec).predictor.processes_per_replica

    @property
    def graceful_s(self) -> float:
        return graceful_timeout_s(ApiConfig.from_dict(self.api.spec).predictor)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        """Routable: every process has built the predictor; once that was so, a process that died
        while gunicorn replaces it leaves the replica serving on the others (not a 503 for all)."""
        if not self.running():
            return False
        count = self.markers.ready_count()
        if count >= self.processes:
            self.has_been_ready, self.failing = True, False
        return count >= self.processes or (self.has_been_ready and count > 0)

    def record(self, host: str, now: float, placement_host: str = "") -> ReplicaRecord:
        ready = self.ready()
        return ReplicaRecord(
            replica_id=self.replica_id, api=self.api.name, bundle=self.api.bundle, host=host, port=self.port,
            processes=self.processes, ready=ready, draining=self.draining_since is not None, seen=now,
            pid=os.getpid(), message="" if ready else (self.markers.failure() or self.message),
            failing=not ready and bool(self.markers.failure() or self.failing),
            socket=self.unix_socket, host_id=host_identity() if self.unix_socket else "",
            placement_host=placement_host, last_oom_at=self.last_oom_at, last_oom=self.last_oom,
            devices=self.env.get("CUDA_VISIBLE_DEVICES", ""), tls=self.tls,
        )


# -- the launcher --------------------------------------------------------------------------------
class ReplicaLauncher:
    """Keeps this host's replica of one realtime API running, rolling it when the API is redeployed."""

    def __init__(
        self, api_name: str, *, redis_client: redis.Redis, bundles: BundleStore, state_root: Path,
        port: int, host: str = "127.0.0.1", advertise: str | None = None, api_url: str = DEFAULT_API_URL,
        base_env: Mapping[str, str] | None = None, drain_cap_s: float = DRAIN_CAP_S,
        unrouted: Unrouted | None = None, spawn: Callable[..., subprocess.Popen[bytes]] = spawn_gunicorn,
        registry: ApiRegistry | None = None, directory: ReplicaDirectory | None = None,
        placement_host: str = "", environments: HostEnvironments | None = None,
        memory_limits: MemoryLimits | None = None, cpu_limits: CpuLimits | None = None,
        rollout_slots: RolloutSlots | None = None, scale: ScaleBook | None = None,
    ) -> None:
        """`registry`, `directory`, `rollout_slots` and `scale` default to Redis's through
        `redis_client`; a fast test hands in fakes and its own `unrouted` (its client is then never used)."""
        self.api_name = api_name
        self._redis = redis_client
        self._registry: ApiRegistry = registry or RedisApiRegistry(redis_client)
        self._directory: ReplicaDirectory = directory or RedisReplicaDirectory(redis_client)
        self._bundles = bundles
        self._state_root = Path(state_root)
        self.base_port = port
        self.host = host
        self.advertise = advertised_address(host, advertise, toward=redis_host(redis_client))
        self.api_url = api_url
        self.placement_host = placement_host  # announced with each replica: whose assignment it is
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._drain_cap_s = drain_cap_s
        self._unrouted = unrouted or _proxy_unrouted()
        self._spawn = spawn
        self._environments = environments or HostEnvironments(self._state_root / "environments")
        self._memory_limits = memory_limits or MemoryLimits(LimitMode.OFF, "not asked for")
        self._cpu_limits = cpu_limits or CpuLimits("not asked for")
        # This host's certificate for its replicas (SLUICE_HOST_TLS_CERT/KEY).
        self._host_tls = host_tls(self._base_env)
        self._slots: RolloutSlots = rollout_slots or RedisRolloutSlots(redis_client)
        self._scale: ScaleBook = scale or RedisScaleBook(redis_client)
        # This launcher among the API's others, as the rollout slots name it.
        self.launcher_id = f"{placement_host or socket.gethostname()}:{self.advertise}:{port}"
        # The redeploy this launcher holds a rollout slot for: (api, deployment identity), and the kind.
        self.rollout: tuple[str, str, str] | None = None
        self.serving: Generation | None = None
        self.incoming: Generation | None = None
        self.retiring: list[Generation] = []
        self._stopping = False
        self._prepare_retry_at = 0.0
        self._last_redis_error = 0.0

    # -- public ------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Start the first generation; raises when the API is not a deployed RealtimeAPI."""
        try:
            api = self._registry.get(self.api_name)
        except redis.RedisError as e:
            raise NotReady(f"cannot read the API registry: {e}") from e
        if api.kind != ApiKind.REALTIME:
            raise ConfigError(f"api {self.api_name} is a {api.kind}: only a RealtimeAPI has replicas")
        self.serving = self._prepare(api, self.base_port)
        self._launch(self.serving, now)
        log.info("serving %s (bundle %s) as %s on %s:%d", api.name, api.bundle[:12], self.serving.replica_id,
                 self.host, self.serving.port)

    def stop(self, now: float, wait_for_proxies: bool = True) -> None:
        """Begin stopping every generation; `step` finishes it (`done` becomes true)."""
        if not self._stopping:
            log.info("stopping the replicas of %s", self.api_name)
        self._stopping = True
        for gen in (self.serving, self.incoming):
            if gen is not None:
                self._retire(gen, now, wait_for_proxies)
        self.serving = self.incoming = None
        if not wait_for_proxies:
            for gen in self.retiring:
                gen.drain_now = True
        self._give_back_rollout()

    @property
    def done(self) -> bool:
        return self._stopping and not self.retiring

    def generations(self) -> list[Generation]:
        return [g for g in (self.serving, self.incoming) if g is not None] + self.retiring

    def step(self, now: float) -> None:
        """One turn: follow the registry, keep gunicorns alive, promote, retire, heartbeat."""
        if not self._stopping:
            api = self._lookup(now)
            if api is False:
                self.stop(now, wait_for_proxies=False)
            elif api is not None:
                self._follow(api, now)
        for gen in [g for g in (self.serving, self.incoming) if g is not None]:
            self._keep_alive(gen, now)
        if self.incoming is not None and self.incoming.ready():
            self._promote(now)
        self._keep_rollout(now)
        for gen in list(self.retiring):
            self._advance_retirement(gen, now)
        self._heartbeat(now)

    def close(self) -> None:
        """Last resort on the way out: no gunicorn outlives the launcher."""
        for gen in self.generations():
            if gen.running():
                signal_group(gen.process, signal.SIGKILL)  # type: ignore[arg-type]
                gen.process.wait()  # type: ignore[union-attr]
            self._forget(gen)
        self._memory_limits.close()
        self._cpu_limits.close()

    # -- the registry ------------------------------------------------------------------------
    def _lookup(self, now: float) -> DeployedApi | Literal[False] | None:
        """The API as deployed now; False when it is gone (or no longer realtime); None if unknown."""
        try:
            api = self._registry.get(self.api_name)
        except ApiNotFound:
            log.info("api %s was deleted", self.api_name)
            return False
        except (redis.RedisError, ValueError, TypeError) as e:
            self._redis_trouble(now, e)
            return None
        if api.kind != ApiKind.REALTIME:
            log.info("api %s is now a %s", self.api_name, api.kind)
            return False
        return api

    def _follow(self, api: DeployedApi, now: float) -> None:
        """Start a generation of the deployed version unless one is serving or on its way."""
        target = deployment_identity(api)
        if self.serving is not None and self.serving.identity == target:
            if self.incoming is not None:  # redeployed back to what is serving: drop the newcomer
                self._retire(self.incoming, now, wait_for_proxies=True)
                self.incoming = None
            return
        if self.incoming is not None:
            if self.incoming.identity == target:
                return
            log.info("%s was redeployed again before %s was ready", api.name, self.incoming.replica_id)
            self._retire(self.incoming, now, wait_for_proxies=True)
            self.incoming = None
        port = self.base_port if self.serving is None else alternate_port(self.base_port, self.serving.port)
        if any(g.port == port and g.running() for g in self.retiring) or now < self._prepare_retry_at:
            return  # the port is still held by a generation on its way out
        room = None
        if self.serving is not None:  # a redeploy: replace the serving replica only within the update strategy
            room = self._take_rollout(api, target, now)
            if room is None:
                return  # as many of the API's replicas as it allows are being replaced: wait for a turn
        try:
            gen = self._prepare(api, port)
        except (SluiceError, OSError) as e:
            log.error("cannot prepare bundle %s of %s: %s; retrying in 5 s", api.bundle[:12], api.name, e)
            self._prepare_retry_at = now + 5.0
            self._give_back_rollout()
            return
        self._launch(gen, now)
        log.info("%s redeployed (bundle %s): starting %s on port %d%s", api.name, api.bundle[:12], gen.replica_id,
                 port, f" ({room} slot)" if room else "")
        if self.serving is None:
            self.serving = gen
        elif room == UNAVAILABLE:  # the old replica makes room first: it drains while the new one starts
            self._retire(self.serving, now, wait_for_proxies=True)
            self.serving = gen
        else:
            self.incoming = gen

    # -- rolling within the update strategy ----------------------------------------------------
    def _take_rollout(self, api: DeployedApi, target: str, now: float) -> str | None:
        """A surge slot, else an unavailable slot, for replacing this replica with `target`; None
        while the API's update strategy allows no more replicas replaced at once."""
        if self.rollout is not None and self.rollout[:2] != (api.name, target):
            self._give_back_rollout()  # a slot of an earlier redeploy, overtaken by this one
        try:
            surge, unavailable = ApiConfig.from_dict(api.spec).rollout.bounds(self._desired(api.name))
            for kind, limit in ((SURGE, surge), (UNAVAILABLE, unavailable)):
                if self._slots.take(api.name, target, kind, self.launcher_id, limit, now):
                    self.rollout = (api.name, target, kind)
                    return kind
        except (redis.RedisError, ConfigError) as e:
            self._redis_trouble(now, e)
        return None

    def _desired(self, api_name: str) -> int:
        """The replicas the API wants now: the scaler's decision, else as many as are announced."""
        decided = self._scale.get(api_name)
        if decided is not None:
            return decided.desired
        return len([r for r in self._directory.all() if r.api == api_name and not r.draining]) or 1

    def _keep_rollout(self, now: float) -> None:
        """Renew the slot while the new replica starts; give it back once it serves."""
        if self.rollout is None:
            return
        api_name, target, kind = self.rollout
        if self.incoming is None and self.serving is not None and self.serving.identity == target \
                and self.serving.ready():
            self._give_back_rollout()
            return
        try:
            self._slots.take(api_name, target, kind, self.launcher_id, 1, now)  # its own: renewed, whatever the limit
        except redis.RedisError as e:
            self._redis_trouble(now, e)

    def _give_back_rollout(self) -> None:
        if self.rollout is None:
            return
        api_name, target, _ = self.rollout
        self.rollout = None
        try:
            self._slots.give_back(api_name, target, self.launcher_id)
        except redis.RedisError as e:
            self._redis_trouble(time.time(), e)

    # -- generations -------------------------------------------------------------------------
    def _prepare(self, api: DeployedApi, port: int) -> Generation:
        """Fetch the bundle and write the state folder of a new generation."""
        project_dir = self._bundles.local_folder(api.bundle)
        replica_id = new_replica_id(api.name, port)
        state_dir = self._state_root / replica_id
        (state_dir / "markers").mkdir(parents=True, exist_ok=True)
        spec_path = state_dir / "spec.json"
        spec_path.write_text(json.dumps(api.to_dict(), indent=2), encoding="utf-8")
        env = replica_env(
            self._base_env, project_dir, api, spec_path=spec_path, markers_dir=state_dir / "markers",
            replica_id=replica_id, api_url=self.api_url,
        )
        config = ApiConfig.from_dict(api.spec)
        # Over TLS the replica listens on its TCP port only: a proxy on this host reaches it there too.
        tls = self._host_tls
        unix_socket = socket_path_for(replica_id) if tls is None else None
        argv = replica_argv(config.predictor, f"{self.host}:{port}", unix_socket=unix_socket, tls=tls)
        gen = Generation(replica_id, api, port, project_dir, state_dir, env, argv, unix_socket=unix_socket or "",
                         tls=tls is not None)
        if api.environment:
            gen.environment = BackgroundBuild(self._environments, api.environment, project_dir, config)
        return gen

    def _environment_ready(self, gen: Generation, now: float) -> bool:
        """Whether the generation may start: it has no environment of its own, or it is built (then
        its gunicorn runs with the environment's interpreter). Until then it says why it waits."""
        build = gen.environment
        if build is None:
            return True
        if not build.done():
            gen.message, gen.failing = f"building its environment {build.key}: {build.stage}", False
            return False
        if build.environment is None:
            gen.message, gen.failing = f"building its environment {build.key} failed: {build.error}", True
            if now - build.finished_at >= ENVIRONMENT_RETRY_S:
                log.info("%s: building environment %s again", gen.replica_id, build.key)
                gen.environment = build.again()
            return False
        gen.argv[0] = str(build.environment.python)
        gen.environment, gen.environment_used = None, build
        log.info("%s runs in environment %s", gen.replica_id, build.key)
        return True

    def _launch(self, gen: Generation, now: float) -> None:
        if not self._environment_ready(gen, now):
            gen.process = None
            gen.restart_at = now  # looked at again on the next step
            return
        remove_stale(gen.unix_socket)  # a gunicorn of this generation that died left it behind
        # Started in its state folder, not the project: `python -m gunicorn` puts its working folder
        # first on sys.path, where a project's own `api.py` would be imported for Sluice's `api`. The
        # predictor's namespace moves into the project folder when it is built (namespace.py).
        self._prepare_memory_group(gen)
        gen.process = self._spawn(gen.argv, gen.env, gen.state_dir)
        self._limit_memory(gen)
        self._share_cpu(gen)
        gen.has_been_ready = False
        gen.started_at = now
        gen.message = "starting"  # `failing` stays as it was: a server that keeps exiting is still failing

    def _prepare_memory_group(self, gen: Generation) -> None:
        """Make the generation's memory group at its first start (its API's compute.mem, plus Sluice's
        own part of each of its processes), and tell its processes where its usage is read, for their
        guard (foundation/memory_guard.py)."""
        config = ApiConfig.from_dict(gen.api.spec)
        if config.compute.mem is None or gen.memory is not None:
            return
        try:
            limit = replica_limit(mem_bytes(config.compute.mem), config.predictor.processes_per_replica)
            gen.memory = self._memory_limits.group(gen.replica_id, limit)
        except OSError as e:
            log.error("%s: its memory limit could not be set (%s); it runs without one", gen.replica_id, e)
            return
        usage = gen.memory.usage_file if gen.memory is not None else None
        if gen.memory is not None and usage is not None:
            gen.env.update({USAGE_FILE_VARIABLE: str(usage), LIMIT_FILE_VARIABLE: str(gen.memory.limit_file)})

    def _limit_memory(self, gen: Generation) -> None:
        """Put the generation's new process tree in its memory group."""
        if gen.process is None:
            return
        try:
            if gen.memory is not None:
                gen.memory.join(gen.process.pid)
        except OSError as e:  # the group cannot be made or joined: the replica serves, unlimited, and says so
            log.error("%s: its memory limit could not be set (%s); it runs without one", gen.replica_id, e)
            gen.memory = None

    def _share_cpu(self, gen: Generation) -> None:
        """Put the generation's new process tree in its CPU group: its API's compute.cpu as its weight."""
        if gen.process is None:
            return
        try:
            if gen.cpu is None:
                gen.cpu = self._cpu_limits.group(gen.replica_id,
                                                 cpu_millis(ApiConfig.from_dict(gen.api.spec).compute.cpu))
            if gen.cpu is not None:
                gen.cpu.join(gen.process.pid)
        except OSError as e:  # it serves, with the host's default share, and says so
            log.error("%s: its cpu share could not be set (%s); it runs with the default one", gen.replica_id, e)
            gen.cpu = None

    def _watch_memory(self, gen: Generation, now: float) -> None:
        """Enforce a watched limit, and notice a process of the tree stopped for memory: by the kernel
        (or the watchdog), or leaving on its own guard's word (foundation/memory_guard.py)."""
        group = gen.memory
        if group is None:
            return
        group.check()
        for note in gen.markers.take_out_of_memory_notes():
            gen.last_oom_at, gen.last_oom = now, note
            log.error("%s: %s", gen.replica_id, note, extra={"api": gen.api.name})
        kills = group.oom_kills()
        if kills <= gen.oom_kills:
            return
        gen.oom_kills = kills
        gen.last_oom_at = now
        gen.last_oom = (f"a process was stopped for memory: over its limit of {human_bytes(group.limit)} "
                        f"(compute.mem and Sluice's own part), peak {human_bytes(group.peak())}")
        log.error("%s: %s", gen.replica_id, gen.last_oom, extra={"api": gen.api.name})

    def _keep_alive(self, gen: Generation, now: float) -> None:
        """Start again, on the same port, a gunicorn that exited; back off if it keeps dying."""
        self._watch_memory(gen, now)
        if gen.process is None:
            if now >= gen.restart_at:
                self._launch(gen, now)
            return
        code = gen.process.poll()
        if code is None:
            if now - gen.started_at >= QUICK_EXIT_S:
                gen.quick_failures = 0
            return
        gen.quick_failures = gen.quick_failures + 1 if now - gen.started_at < QUICK_EXIT_S else 1
        delay = restart_delay_s(gen.quick_failures - 1)
        # Workers orphaned by a dead arbiter would keep the port (a sync worker notices late).
        signal_group(gen.process, signal.SIGKILL)
        gen.restarts += 1
        server = "the gRPC server" if gen.argv[1:3] == ["-m", "sluice.grpc_replica"] else "gunicorn"
        gen.message, gen.failing = f"{server} exited with status {code}; restarting", True
        log.error("%s: %s exited with status %s; restarting in %.1f s", gen.replica_id, server, code, delay)
        gen.process = None
        gen.restart_at = now + delay
        if delay == 0:
            self._launch(gen, now)

    def _promote(self, now: float) -> None:
        """The new generation is ready: it takes the traffic, the old one drains."""
        assert self.incoming is not None
        old, self.serving, self.incoming = self.serving, self.incoming, None
        log.info("%s is ready", self.serving.replica_id)
        if old is not None:
            self._retire(old, now, wait_for_proxies=True)

    def _retire(self, gen: Generation, now: float, wait_for_proxies: bool) -> None:
        if gen.draining_since is None:
            gen.draining_since = now
        gen.drain_now = gen.drain_now or not wait_for_proxies
        if gen not in self.retiring:
            self.retiring.append(gen)

    def _advance_retirement(self, gen: Generation, now: float) -> None:
        """Draining -> (unrouted or capped) SIGTERM -> (exited or overdue) gone."""
        assert gen.draining_since is not None
        if not gen.running():
            self._forget(gen)
            return
        if gen.stop_sent_at is None:
            if gen.drain_now or now - gen.draining_since >= self._drain_cap_s or self._is_unrouted(gen, now):
                log.info("stopping %s", gen.replica_id)
                gen.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                gen.stop_sent_at = now
        elif now - gen.stop_sent_at > gen.graceful_s + KILL_AFTER_GRACE_S:
            log.error("%s did not stop within %.0f s; killing it", gen.replica_id, gen.graceful_s)
            signal_group(gen.process, signal.SIGKILL)  # type: ignore[arg-type]

    def _is_unrouted(self, gen: Generation, now: float) -> bool:
        try:
            return bool(self._unrouted(self._redis, gen.replica_id, now))
        except redis.RedisError as e:
            self._redis_trouble(now, e)
            return False

    def _forget(self, gen: Generation) -> None:
        """A generation is over: its record and state folder go; its bundle stays cached."""
        if gen in self.retiring:
            self.retiring.remove(gen)
        if gen.process is not None and gen.process.poll() is None:
            return
        if gen.process is not None:
            signal_group(gen.process, signal.SIGKILL)  # workers left behind by a dead arbiter
        if gen.memory is not None:
            gen.memory.close()
        if gen.cpu is not None:
            gen.cpu.close()
        self._bundles.release(gen.api.bundle)  # the cache may evict it once nothing else uses it
        for build in (gen.environment_used, gen.environment):
            if build is not None:
                build.release()
        try:
            self._directory.remove(gen.replica_id)
        except redis.RedisError as e:
            self._redis_trouble(time.time(), e)
        shutil.rmtree(gen.state_dir, ignore_errors=True)
        remove_stale(gen.unix_socket)

    # -- heartbeat ---------------------------------------------------------------------------
    def _heartbeat(self, now: float) -> None:
        """Announce every generation: at once when its state changed, else every HEARTBEAT_S."""
        for gen in self.generations():
            record = gen.record(self.advertise, now, self.placement_host)
            state = (record.ready, record.draining, record.message, record.last_oom_at)
            if state == gen.last_announced and now - gen.last_announced_at < HEARTBEAT_S:
                continue
            try:
                self._directory.announce(record)
            except redis.RedisError as e:
                self._redis_trouble(now, e)
                return
            gen.last_announced, gen.last_announced_at = state, now

    def _redis_trouble(self, now: float, error: Exception) -> None:
        if now - self._last_redis_error > 10:
            log.error("redis: %s (replicas keep serving)", error)
            self._last_redis_error = now


# -- the command ---------------------------------------------------------------------------------
def serve(
    api_name: str, *, port: int, host: str = "127.0.0.1", advertise: str | None = None,
    api_url: str = DEFAULT_API_URL, state_dir: Path | None = None, env: Mapping[str, str] | None = None,
    placement_host: str = "",
) -> int:
    """Run the launcher until the API is deleted or SIGTERM/SIGINT arrives; the process exit status.

    The first signal drains (the proxies stop routing the replica before it stops); a second
    one stops at once (gunicorn still finishes the requests it has).
    """
    from foundation.settings import Settings

    env = dict(os.environ if env is None else env)
    settings = Settings.from_env(env)
    # Short timeouts, no retries inside a command: a stalled Redis must not stall the loop that
    # keeps gunicorn alive (the replica keeps serving; heartbeats resume with Redis).
    client = heartbeat_client(settings)
    bundles = BundleStore(
        settings.storage, settings.cache_dir, cache_bytes=settings.bundle_cache_bytes,
        limits=BundleLimits(settings.max_unpacked_bundle_bytes, settings.max_bundle_files),
    )
    memory_limits, cpu_limits = MemoryLimits.from_env(env), CpuLimits.from_env(env)
    log.info("memory limits of %s's replica: %s; cpu: %s", api_name, memory_limits.reason, cpu_limits.reason)
    launcher = ReplicaLauncher(
        api_name, redis_client=client, bundles=bundles,
        state_root=state_dir or Path(settings.cache_dir).expanduser() / "replicas", port=port, host=host,
        advertise=advertise, api_url=api_url, base_env=env, placement_host=placement_host,
        environments=HostEnvironments.under(settings.cache_dir, events=RedisEnvironmentStates(client)),
        memory_limits=memory_limits, cpu_limits=cpu_limits,
    )
    signals = 0

    def _request_stop(*_: object) -> None:
        nonlocal signals
        signals += 1

    previous = {sig: signal.signal(sig, _request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        launcher.start(time.time())
        while not launcher.done:
            if signals:
                launcher.stop(time.time(), wait_for_proxies=signals < 2)
            launcher.step(time.time())
            if not launcher.done:
                time.sleep(TICK_S)
        return 0
    finally:
        launcher.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
