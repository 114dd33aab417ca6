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

import contextlib
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

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry, DeployedApi, RedisApiRegistry
from foundation.devices import NEURON, HostDevices, devices_folder, host_cores, host_gpus
from foundation.hosts import HostDirectory, HostRecord, RedisHostDirectory, Resources
from foundation.redis_clients import heartbeat_client
from foundation.replica_placement import RedisReplicaAssignments, ReplicaAssignments, on_host

from . import pod_deletion_cost
from .replica import DEFAULT_API_URL, DRAIN_CAP_S, KILL_AFTER_GRACE_S, advertised_address, redis_host, restart_delay_s
from .replica_process import MIN_GRACEFUL_S, spawn_gunicorn

log = logging.getLogger("sluice.replicas")

# A launcher that exits within this many seconds of its start is started again after a back-off.
QUICK_EXIT_S = 10.0

SpawnLauncher = Callable[[str, int, Mapping[str, str]], subprocess.Popen[bytes]]
"""Start the launcher of an API's replica on a slot's port, with these variables added (its devices)."""
SelectApi = Callable[[DeployedApi], bool]

HARDWARE = ("cpu", "gpu")
STEP_S = 0.5
# A stopping launcher drains (up to DRAIN_CAP_S), then its gunicorn finishes its requests.
STOP_GRACE_S = DRAIN_CAP_S + MIN_GRACEFUL_S + KILL_AFTER_GRACE_S


def gpus_of(api: DeployedApi, field: str = "gpu") -> int:
    """An API's `compute.gpu` (or another count of devices: `inf`), 0 when its spec cannot say."""
    compute = api.spec.get("compute") if isinstance(api.spec, dict) else None
    try:
        return int((compute or {}).get(field) or 0)
    except (TypeError, ValueError):
        return 0


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
            port = int(s.getsockname()[1])
        if port + 1 <= 65535 and not {port, port + 1} & set(taken) and _bindable(port + 1):
            return port
    raise OSError("no two adjacent free ports found for a replica")


@dataclass
class Launcher:
    """A launcher child process and the ports it was given (its slot: P and P+1)."""

    api: str
    port: int
    process: subprocess.Popen[bytes]
    started_at: float
    quick_failures: int = 0
    restarts: int = 0
    stopping: bool = False  # sent SIGTERM: fewer replicas wanted here, or its API is another host kind's


# How many replicas of each API this host runs (placement's word, `foundation/replica_placement.py`);
# None when it cannot be read now (then nothing is started or stopped for it).
Assigned = Callable[[], dict[str, int] | None]


class ReplicaManager:
    """Keeps as many launchers of each RealtimeAPI running as this host is assigned; `step(now)`
    is one turn.

    Without `assigned` (a host no placement runs for, as in tests of the launchers' lifecycle) it
    runs one of each API it serves. Each launcher has a slot of its own: two ports (P, P+1) kept
    while the slot lives, so a restarted launcher comes back where the proxy expects it. One fewer
    assigned stops the newest slot's launcher with SIGTERM: it leaves the proxy, finishes what it
    holds, then exits, and its slot goes.
    """

    def __init__(
        self, registry: ApiRegistry, spawn: SpawnLauncher,
        allocate_port: Callable[[set[int]], int] = free_port_pair, select: SelectApi | None = None,
        assigned: Assigned | None = None, devices: HostDevices | None = None,
        cores: HostDevices | None = None,
    ) -> None:
        """`devices`: the host's GPUs, each handed to one replica placed with `compute.gpu` (None: no
        devices are handed out, as where a test stands in for the launchers)."""
        self._registry = registry
        self.devices = devices
        self.cores = cores                   # the host's Neuron cores, handed out by compute.inf
        self._gpus_of: dict[str, int] = {}  # api -> its compute.gpu, as last read
        self._cores_of: dict[str, int] = {}  # api -> its compute.inf, as last read
        self._waiting_for_devices: set[tuple[str, int]] = set()
        self._spawn = spawn
        self._allocate = allocate_port
        self._select = select or on_hardware(None)
        self._assigned = assigned
        self.launchers: dict[tuple[str, int], Launcher] = {}  # (api, slot port) -> its launcher
        self._slots: dict[str, list[int]] = {}  # api -> its slots' ports, oldest first (stopping ones too)
        self._due: dict[tuple[str, int], tuple[float, int, int]] = {}  # slot -> (start at, quick failures, restarts)

    def running(self, api: str) -> list[Launcher]:
        """The API's launchers not on their way out, oldest slot first."""
        return [self.launchers[(api, port)] for port in self._slots.get(api, [])
                if (api, port) in self.launchers and not self.launchers[(api, port)].stopping]

    def _realtime_apis(self) -> tuple[set[str], set[str]] | None:
        """The deployed RealtimeAPIs this host serves and those it leaves to others; None if unknown."""
        try:
            apis = [api for api in self._registry.all() if api.kind == ApiKind.REALTIME]
        except (redis.RedisError, ValueError, TypeError) as e:
            log.warning("cannot read the API registry: %s", e)
            return None
        served = {api.name for api in apis if self._select(api)}
        self._gpus_of = {api.name: gpus_of(api) for api in apis}
        self._cores_of = {api.name: gpus_of(api, "inf") for api in apis}
        return served, {api.name for api in apis} - served

    def _wanted(self, deployed: set[str]) -> dict[str, int] | None:
        if self._assigned is None:
            return dict.fromkeys(deployed, 1)
        try:
            counts = self._assigned()
        except (redis.RedisError, ValueError, TypeError, KeyError) as e:
            log.warning("cannot read this host's replica placement: %s", e)
            return None
        return None if counts is None else {api: n for api, n in counts.items() if api in deployed}

    def _stop_launcher(self, launcher: Launcher, why: str) -> None:
        log.info("stopping a replica of %s (port %d): %s", launcher.api, launcher.port, why)
        launcher.process.send_signal(signal.SIGTERM)
        launcher.stopping = True

    def _reap(self, now: float, deployed: set[str] | None, elsewhere: set[str]) -> None:
        """Note launchers that exited (a stopped one frees its slot; another is started again)."""
        for key, launcher in list(self.launchers.items()):
            code = launcher.process.poll()
            if code is None:
                if launcher.api in elsewhere and not launcher.stopping:
                    self._stop_launcher(launcher, "it was redeployed for another kind of host")
                if now - launcher.started_at >= QUICK_EXIT_S:
                    launcher.quick_failures = 0
                continue
            del self.launchers[key]
            if launcher.stopping:
                self._drop_slot(*key)
                continue
            quick = now - launcher.started_at < QUICK_EXIT_S and code != 0
            failures = launcher.quick_failures + 1 if quick else 0
            self._due[key] = (now + restart_delay_s(failures), failures, launcher.restarts + 1)
            if deployed is None or launcher.api in deployed:
                log.warning("the launcher of %s exited with status %s; starting it again", launcher.api, code)

    def _drop_slot(self, api: str, port: int) -> None:
        for book in (self.devices, self.cores):
            if book is not None:
                book.release(f"replica {api}:{port}")
        ports = self._slots.get(api, [])
        if port in ports:
            ports.remove(port)
        if not ports:
            self._slots.pop(api, None)
        self._due.pop((api, port), None)

    def step(self, now: float) -> None:
        found = self._realtime_apis()
        deployed, elsewhere = found if found is not None else (None, set())
        self._reap(now, deployed, elsewhere)
        if deployed is None:
            return
        wanted = self._wanted(deployed)
        if wanted is not None:
            self._resize(wanted, deployed)
        for api in sorted(deployed):
            for port in list(self._slots.get(api, [])):
                if (api, port) not in self.launchers:
                    self._start(api, port, now)
        for api in set(self._slots) - deployed:  # deleted: its launchers exit on their own
            for port in list(self._slots[api]):
                if (api, port) not in self.launchers:
                    self._drop_slot(api, port)

    def _resize(self, wanted: dict[str, int], deployed: set[str]) -> None:
        """Open slots for replicas newly assigned here; stop the newest ones no longer assigned."""
        for api in sorted(set(wanted) | (set(self._slots) & deployed)):
            want = wanted.get(api, 0)
            active = [p for p in self._slots.get(api, []) if not self._is_stopping(api, p)]
            for port in reversed(active[want:]):
                launcher = self.launchers.get((api, port))
                if launcher is None:  # waiting to be started again: nothing to stop
                    self._drop_slot(api, port)
                else:
                    self._stop_launcher(launcher, f"{want} assigned to this host")
            for _ in range(want - len(active)):
                taken = {p + i for ports in self._slots.values() for p in ports for i in (0, 1)}
                self._slots.setdefault(api, []).append(self._allocate(taken))

    def _is_stopping(self, api: str, port: int) -> bool:
        launcher = self.launchers.get((api, port))
        return launcher is not None and launcher.stopping

    def _start(self, api: str, port: int, now: float) -> None:
        start_at, failures, restarts = self._due.get((api, port), (0.0, 0, 0))
        if now < start_at:
            return
        devices: dict[str, str] = {}
        for book, count, what in ((self.devices, self._gpus_of.get(api, 0), "GPU"),
                                  (self.cores, self._cores_of.get(api, 0), "Neuron core")):
            if book is None:
                continue
            claimed = book.claim(f"replica {api}:{port}", count)  # kept by the slot across restarts
            if claimed is None:
                if (api, port) not in self._waiting_for_devices:
                    self._waiting_for_devices.add((api, port))
                    log.warning("a replica of %s waits for %d free %s(s) of this host (free: %s)", api, count, what,
                                ", ".join(book.free()) or "none")
                if book is self.cores and self.devices is not None:
                    self.devices.release(f"replica {api}:{port}")  # not held while it waits for the others
                return
            devices.update(book.visible(claimed))
        self._waiting_for_devices.discard((api, port))
        try:
            process = self._spawn(api, port, devices)
        except OSError as e:
            log.error("cannot start the launcher of %s: %s", api, e)
            self._due[(api, port)] = (now + 5.0, failures, restarts)
            return
        self.launchers[(api, port)] = Launcher(api, port, process, now, failures, restarts)
        self._due.pop((api, port), None)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM every launcher (each drains and stops its replica), then kill what is left."""
        for book in (self.devices, self.cores):
            if book is not None:
                book.release_all()
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
        self._slots.clear()


# -- the host's announcement ---------------------------------------------------------------------
HOST_HEARTBEAT_S = 2.0  # well inside foundation.hosts.HOST_TTL_S
# Heartbeats per host TTL at least: a host shortened to a few seconds (`SLUICE_HOST_TTL`) misses
# one heartbeat on a loaded machine without losing its replicas.
HEARTBEATS_PER_TTL = 4


def host_heartbeat_s(host_ttl_s: float) -> float:
    """How often a host announces itself: every HOST_HEARTBEAT_S, more often under a short TTL."""
    return min(HOST_HEARTBEAT_S, host_ttl_s / HEARTBEATS_PER_TTL)


def default_host_id(address: str, hardware: str | None) -> str:
    """Stable across restarts of the agent (a restarted host keeps its replicas' placement), and
    distinct for a `--gpu` and a `--cpu` agent on one machine."""
    return f"{socket.gethostname()}/{address}/{hardware or 'all'}"


class HostAgent:
    """This host's part in placement: announces the room it offers, and reads what it is assigned."""

    def __init__(self, directory: HostDirectory, assignments: ReplicaAssignments, *, host_id: str, address: str,
                 offers: Resources, hardware: str | None, every_s: float = HOST_HEARTBEAT_S,
                 pool: str | None = None, room: str = "") -> None:
        self.host_id = host_id
        self._pool = pool
        self._room = room
        self._directory = directory
        self._assignments = assignments
        self._address = address
        self._offers = offers
        self._hardware = hardware
        self._every_s = every_s
        self._announced_at = -every_s

    def heartbeat(self, now: float) -> None:
        """Announce the host every `every_s` (a Redis error waits for the next turn)."""
        if now - self._announced_at < self._every_s:
            return
        record = HostRecord(self.host_id, self._address, self._offers, self._hardware, ("replicas",), now, self._pool,
                            self._room)
        try:
            self._directory.announce(record)
        except redis.RedisError as e:
            log.warning("cannot announce this host: %s", e)
            return
        self._announced_at = now

    def assigned(self) -> dict[str, int]:
        """API name -> how many of its replicas placement put on this host."""
        return on_host(self._assignments.all(), self.host_id)

    def held(self) -> int:
        """Replicas placed on this host, for its pod's deletion cost (`sluice/pod_deletion_cost.py`)."""
        return sum(self.assigned().values())

    def leave(self) -> None:
        """The agent stops: its replicas are placed elsewhere at placement's next step."""
        try:
            self._directory.remove(self.host_id)
        except redis.RedisError as e:
            log.warning("cannot remove this host's record (it expires): %s", e)


# -- the command ---------------------------------------------------------------------------------
def launcher_argv(
    api_name: str, port: int, *, host: str, advertise: str, api_url: str, state_dir: Path,
    python: str = sys.executable, placement_host: str = "",
) -> list[str]:
    """`sluice serve` for one API, as the manager starts it; `placement_host` is announced with the
    replica, so ready replicas are counted per placement host."""
    return [
        python, "-m", "sluice.cli", "serve", api_name, "--port", str(port), "--host", host,
        "--advertise", advertise, "--api-url", api_url, "--state-dir", str(state_dir),
        *(["--placement-host", placement_host] if placement_host else []),
    ]


def serve_all(
    *, hardware: str | None = None, host: str = "127.0.0.1", advertise: str | None = None,
    api_url: str = DEFAULT_API_URL, state_dir: Path | None = None, env: Mapping[str, str] | None = None,
    offers: Resources | None = None, host_id: str | None = None, pool: str | None = None, room: str = "",
) -> int:
    """`sluice replicas`: announces the room this host offers (`offers`, default the machine's) and
    runs the replicas placement assigns it (of one kind of hardware), until SIGTERM/SIGINT, which
    drains and stops them all; the exit status.

    The launchers are started in sessions of their own (a Ctrl-C reaches only this process,
    which stops them in order) and get SIGTERM should this process die.
    """
    from foundation.settings import Settings
    from jobs.store import JobStore
    from predictors_runtime.environments import HostEnvironments

    from .environment_upkeep import EnvironmentUpkeep

    env = dict(os.environ if env is None else env)
    settings = Settings.from_env(env)
    select = on_hardware(hardware)
    client = heartbeat_client(settings)  # short timeouts, no retries: the next step is the retry
    state_root = state_dir or Path(settings.cache_dir).expanduser() / "replicas"
    # Resolved once, so every launcher of this host announces the same address.
    address = advertised_address(host, advertise, toward=redis_host(client))

    from foundation.hosts import machine_resources

    agent = HostAgent(RedisHostDirectory(client), RedisReplicaAssignments(client),
                      host_id=host_id or default_host_id(address, hardware), address=address,
                      offers=offers if offers is not None else machine_resources(), hardware=hardware,
                      every_s=host_heartbeat_s(settings.host_ttl_s), pool=pool, room=room)
    cost = pod_deletion_cost.in_pod(env)

    def spawn(api_name: str, port: int, devices: Mapping[str, str]) -> subprocess.Popen[bytes]:
        argv = launcher_argv(api_name, port, host=host, advertise=address, api_url=api_url, state_dir=state_root,
                             placement_host=agent.host_id)
        return spawn_gunicorn(argv, {**env, **devices}, Path.cwd())  # any command: own session, dies with us
    offered = offers if offers is not None else machine_resources()
    folder = devices_folder(env, settings.cache_dir)
    manager = ReplicaManager(RedisApiRegistry(client), spawn, select=select, assigned=agent.assigned,
                             devices=HostDevices(folder, host_gpus(offered.gpu, env)),
                             cores=HostDevices(folder, host_cores(offered.inf, env), kind=NEURON))
    upkeep = EnvironmentUpkeep(HostEnvironments.under(settings.cache_dir), RedisApiRegistry(client),
                               JobStore(client, settings.job_ttl_s), grace_s=settings.environment_grace_s)
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("host %s serves %s realtime APIs on %s (advertised as %s)", agent.host_id, hardware or "all", host,
             address)
    try:
        while not stopping.is_set():
            agent.heartbeat(time.time())
            manager.step(time.time())
            if cost is not None:
                with contextlib.suppress(redis.RedisError):  # Redis away: the cost waits with the rest
                    cost.update(agent.held(), time.time())
            upkeep.step(time.time())
            stopping.wait(STEP_S)
        return 0
    finally:
        agent.leave()
        manager.stop(grace=STOP_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
