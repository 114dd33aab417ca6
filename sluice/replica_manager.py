"""One `sluice serve` launcher per deployed RealtimeAPI on this host: what `sluice up` and
`sluice replicas` run.

The manager only starts launchers and starts again the ones that die; everything else (the
bundle, gunicorn, redeploys, stopping when the API is deleted) is the launcher's. A launcher
whose API was deleted exits on its own, and is not started again. Each API keeps the two ports
it was given (P for one generation of its replica, P+1 for the next) for as long as it is
deployed, so a restarted launcher comes back where the proxy expects it.

A host may serve only some of the APIs (`sluice replicas --gpu` on a GPU host, `--cpu` on the
others): a launcher whose API was redeployed for the other kind of host is stopped (its replica
drains first), and the manager of that kind of host starts one.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import redis

from foundation.api_registry import ApiRegistry, DeployedApi, RedisApiRegistry
from foundation.redis_clients import heartbeat_client

from .replica import (
    DEFAULT_API_URL,
    DRAIN_CAP_S,
    KILL_AFTER_GRACE_S,
    REALTIME_KIND,
    advertised_address,
    redis_host,
    restart_delay_s,
)
from .replica_process import MIN_GRACEFUL_S, spawn_gunicorn

log = logging.getLogger("sluice.replicas")

# A launcher that exits within this many seconds of its start is started again after a back-off.
QUICK_EXIT_S = 10.0

SpawnLauncher = Callable[[str, int], subprocess.Popen]
SelectApi = Callable[[DeployedApi], bool]

HARDWARE = ("cpu", "gpu")
STEP_S = 0.5
# A stopping launcher drains (up to DRAIN_CAP_S), then its gunicorn finishes its requests.
STOP_GRACE_S = DRAIN_CAP_S + MIN_GRACEFUL_S + KILL_AFTER_GRACE_S


def on_hardware(hardware: str | None) -> SelectApi:
    """Which realtime APIs a host serves: "gpu" those with `compute.gpu > 0`, "cpu" the others,
    None every one (the split of the Celery queues: an API's queue is "gpu" exactly then)."""
    if hardware is None:
        return lambda api: True
    if hardware not in HARDWARE:
        raise ValueError(f"hardware must be one of {', '.join(HARDWARE)} (got {hardware!r})")
    wants_gpu = hardware == "gpu"
    return lambda api: (api.queue == "gpu") == wants_gpu


def _probe_socket() -> socket.socket:
    """A socket that binds as gunicorn's listeners do: with SO_REUSEADDR, so a port whose last
    connections linger in TIME_WAIT counts as free (a replica's gunicorn binds it all the same)."""
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return probe


def _bindable(port: int) -> bool:
    with _probe_socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pair(taken: set[int] | frozenset[int] = frozenset(), tries: int = 100) -> int:
    """A port P such that P and P+1 are both free now (and neither in `taken`)."""
    for _ in range(tries):
        with _probe_socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 1 <= 65535 and not {port, port + 1} & set(taken) and _bindable(port + 1):
            return port
    raise OSError("no two adjacent free ports found for a replica")


@dataclass
class Launcher:
    """A launcher child process and the ports it was given."""

    api: str
    port: int
    process: subprocess.Popen
    started_at: float
    quick_failures: int = 0
    restarts: int = 0
    stopping: bool = False  # sent SIGTERM: its API is now another kind of host's


class ReplicaManager:
    """Keeps a launcher running for every deployed RealtimeAPI; `step(now)` is one turn."""

    def __init__(
        self, registry: ApiRegistry, spawn: SpawnLauncher,
        allocate_port: Callable[[set[int]], int] = free_port_pair, select: SelectApi | None = None,
    ) -> None:
        self._registry = registry
        self._spawn = spawn
        self._allocate = allocate_port
        self._select = select or on_hardware(None)
        self.launchers: dict[str, Launcher] = {}
        self._ports: dict[str, int] = {}
        self._due: dict[str, tuple[float, int, int]] = {}  # api -> (start at, quick failures, restarts)

    def _realtime_apis(self) -> tuple[set[str], set[str]] | None:
        """The deployed RealtimeAPIs this host serves and those it leaves to others; None if unknown."""
        try:
            apis = [api for api in self._registry.all() if api.kind == REALTIME_KIND]
        except (redis.RedisError, ValueError, TypeError) as e:
            log.warning("cannot read the API registry: %s", e)
            return None
        served = {api.name for api in apis if self._select(api)}
        return served, {api.name for api in apis} - served

    def step(self, now: float) -> None:
        found = self._realtime_apis()
        deployed, elsewhere = found if found is not None else (None, set())
        for name, launcher in list(self.launchers.items()):
            code = launcher.process.poll()
            if code is None:
                if name in elsewhere and not launcher.stopping:
                    log.info("%s was redeployed for another kind of host; stopping its replica here", name)
                    launcher.process.send_signal(signal.SIGTERM)
                    launcher.stopping = True
                if now - launcher.started_at >= QUICK_EXIT_S:
                    launcher.quick_failures = 0
                continue
            del self.launchers[name]
            quick = now - launcher.started_at < QUICK_EXIT_S and code != 0
            failures = launcher.quick_failures + 1 if quick else 0
            self._due[name] = (now + restart_delay_s(failures), failures, launcher.restarts + 1)
            if deployed is None or name in deployed:
                log.warning("the launcher of %s exited with status %s; starting it again", name, code)
        if deployed is None:
            return
        for name in sorted(deployed):
            if name in self.launchers:
                continue
            start_at, failures, restarts = self._due.get(name, (0.0, 0, 0))
            if now < start_at:
                continue
            port = self._ports.get(name)
            if port is None:
                taken = {p + i for p in self._ports.values() for i in (0, 1)}
                port = self._ports[name] = self._allocate(taken)
            try:
                process = self._spawn(name, port)
            except OSError as e:
                log.error("cannot start the launcher of %s: %s", name, e)
                self._due[name] = (now + 5.0, failures, restarts)
                continue
            self.launchers[name] = Launcher(name, port, process, now, failures, restarts)
            self._due.pop(name, None)
        for name in set(self._ports) - deployed - set(self.launchers):
            del self._ports[name]
            self._due.pop(name, None)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM every launcher (each drains and stops its replica), then kill what is left."""
        for launcher in self.launchers.values():
            if launcher.process.poll() is None:
                launcher.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for launcher in self.launchers.values():
            try:
                launcher.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.error("the launcher of %s did not stop within %.0f s; killing it", launcher.api, grace)
                launcher.process.kill()
                launcher.process.wait()
        self.launchers.clear()


# -- the command ---------------------------------------------------------------------------------
def launcher_argv(
    api_name: str, port: int, *, host: str, advertise: str, api_url: str, state_dir: Path,
    python: str = sys.executable,
) -> list[str]:
    """`sluice serve` for one API, as the manager starts it."""
    return [
        python, "-m", "sluice.cli", "serve", api_name, "--port", str(port), "--host", host,
        "--advertise", advertise, "--api-url", api_url, "--state-dir", str(state_dir),
    ]


def serve_all(
    *, hardware: str | None = None, host: str = "127.0.0.1", advertise: str | None = None,
    api_url: str = DEFAULT_API_URL, state_dir: Path | None = None, env: Mapping[str, str] | None = None,
) -> int:
    """`sluice replicas`: a launcher for every deployed RealtimeAPI (of one kind of hardware) on
    this host, until SIGTERM/SIGINT, which drains and stops them all; the exit status.

    The launchers are started in sessions of their own (a Ctrl-C reaches only this process,
    which stops them in order) and get SIGTERM should this process die.
    """
    from foundation.settings import Settings

    env = dict(os.environ if env is None else env)
    settings = Settings.from_env(env)
    select = on_hardware(hardware)
    client = heartbeat_client(settings)  # short timeouts, no retries: the next step is the retry
    state_root = state_dir or Path(settings.cache_dir).expanduser() / "replicas"
    # Resolved once, so every launcher of this host announces the same address.
    address = advertised_address(host, advertise, toward=redis_host(client))

    def spawn(api_name: str, port: int) -> subprocess.Popen:
        argv = launcher_argv(api_name, port, host=host, advertise=address, api_url=api_url, state_dir=state_root)
        return spawn_gunicorn(argv, env, Path.cwd())  # any command: own session, dies with us

    manager = ReplicaManager(RedisApiRegistry(client), spawn, select=select)
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("serving %s realtime APIs on %s (advertised as %s)", hardware or "all", host, address)
    try:
        while not stopping.is_set():
            manager.step(time.time())
            stopping.wait(STEP_S)
        return 0
    finally:
        manager.stop(grace=STOP_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
