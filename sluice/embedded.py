"""The embedded stack: a private redis-server (unless given a Redis or sentinels), worker nodes,
beat, the API, the proxy and the realtime replicas as child processes.

`sluice up` runs one; the integration tests and benchmarks run the same class, so what they
check is what users run. The public port is the proxy's (haproxy, `sluice proxy`): it sends a
realtime API's requests to that API's replicas and everything else to the management API,
which listens on an internal port. The stack is a host that offers its room (`offers`, default
the machine's) to realtime replicas: the replica manager in the supervisor thread announces it and
runs one launcher (`sluice serve`) per replica placement assigns to it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis
import requests
from urllib3.exceptions import InsecureRequestWarning

from foundation import keys
from foundation.api_registry import RedisApiRegistry
from foundation.devices import NEURON, HostDevices, devices_folder, host_cores, host_gpus
from foundation.errors import NotReady
from foundation.hosts import RedisHostDirectory, Resources, machine_resources
from foundation.processes import die_with_parent, stop_trees
from foundation.redis_clients import HEARTBEAT, text
from foundation.redis_clients import client as redis_client
from foundation.replica_placement import RedisReplicaAssignments
from foundation.settings import RedisAddress, Settings, redis_address_from_env

from .replica_manager import HostAgent, ReplicaManager, host_heartbeat_s, on_hardware
from .replica_process import no_control_socket
from .tls.self_signed import make_self_signed

ROOT = Path(__file__).resolve().parent.parent
ALL_QUEUES = ("cpu", "gpu", "inf")
SUPERVISE_INTERVAL_S = 0.5
# Held (flock) by the stack that uses a data folder, with its pid inside: one stack per folder.
DATA_LOCK = "stack.lock"
# Words of a process's own output that say why it stopped, most telling first.
_CAUSE_WORDS = ("Address already in use", "cannot bind", "Bad file format", "Invalid", "FATAL", "Fatal", "Error",
                "error", "cannot", "Cannot", "# ")


class DataDirInUse(NotReady):
    """Another stack runs on this data folder (two would share one Redis append-only file and one storage)."""


def cause_of(log_tail: str) -> str:
    """The line of a process's output that says why it stopped (its last line when none says)."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    for word in _CAUSE_WORDS:
        for line in reversed(lines):
            if word in line:
                return line
    return lines[-1] if lines else "(it wrote nothing)"


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on the port now (as haproxy does: connections of an earlier
    server still closing do not hold it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until(check: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, requests.RequestException, OSError):  # not up yet: ask again
            pass
        time.sleep(interval)
    raise NotReady(f"{what} did not become ready within {timeout:.0f}s")


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)
    is_worker: bool = False
    restarts: int = 0

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Stack:
    """Everything Sluice needs on one host. Use as a context manager, or `start()` / `stop()`."""

    port: int = 8888
    workers: int = 1
    queues: tuple[str, ...] = ALL_QUEUES
    redis_url: str | None = None
    data_dir: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    beat: bool = True
    api_processes: int = 2
    worker_loglevel: str = "INFO"
    # Restart worker nodes that die (as `restart: unless-stopped` does in docker/compose.yaml).
    supervise: bool = True
    # The proxy on the public port; without it the management API listens there itself and
    # realtime APIs cannot be reached.
    proxy: bool = True
    # Realtime replicas on this host, as placement assigns them (launchers kept by the replica manager).
    realtime: bool = True
    # The room this host offers to replicas (default: the machine's cores, memory and GPUs), and the
    # kind of realtime APIs it takes ("cpu", "gpu"; None: every one).
    offers: Resources | None = None
    hardware: str | None = None
    # The management API's internal port (a free one unless given).
    api_port: int | None = None
    # Worker nodes kept by a worker-host agent (`sluice workers`), as on any other host: `workers` is
    # its minimum, more are started while jobs want more `workers` (and AsyncAPIs more nodes) and the
    # room allows, and those above the minimum stop after `idle_grace_s` idle. Without it the stack
    # runs exactly `workers` nodes of its own (what most tests want: nodes they can name and kill).
    worker_host: bool = False
    idle_grace_s: float = 60.0
    children: list[Child] = field(default_factory=list)
    replicas: ReplicaManager | None = None
    host: HostAgent | None = None
    # Start with empty state: what an earlier stack left in `data_dir` (Redis, bundles, caches, logs) goes.
    fresh: bool = False
    # TLS on the public port: a certificate chain and its key, or `self_signed` (a CA and a
    # certificate made in `data_dir/tls`). `ca_bundle` is what the stack's own clients (predictors
    # calling Sluice) trust; with `self_signed`, the CA made.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    self_signed: bool = False
    ca_bundle: Path | None = None
    _own_data_dir: bool = False
    _data_lock: int | None = None
    _start_failed: bool = False
    _worker_count: int = 0
    _stopping: bool = False
    _supervisor: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop_supervising: threading.Event = field(default_factory=threading.Event)

    @property
    def redis_address(self) -> RedisAddress:
        """Where the stack's processes find Redis: `redis_url`, or the sentinels its environment
        names (`SLUICE_REDIS_SENTINELS`, `SLUICE_REDIS_MASTER`; then no private Redis is started)."""
        return redis_address_from_env({**os.environ, **self.env, "SLUICE_REDIS_URL": self.redis_url or ""})

    @property
    def tls(self) -> bool:
        """Whether the public port serves TLS."""
        return self.proxy and (self.tls_cert is not None or self.self_signed)

    @property
    def url(self) -> str:
        """The public URL: the proxy's (or the management API's, without a proxy)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def management_url(self) -> str:
        """The management API directly, bypassing the proxy."""
        return f"http://127.0.0.1:{self.api_port or self.port}"

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        assert self.data_dir is not None, "the stack's data folder is made before any child starts"
        env["SLUICE_REDIS_URL"] = self.redis_url or ""
        env.setdefault("SLUICE_STORAGE", str(self.data_dir / "storage"))
        env.setdefault("SLUICE_CACHE_DIR", str(self.data_dir / "cache"))
        # Predictors find the Sluice that runs them (`sluice.client()`, `cortex.client()`), and trust it.
        env["SLUICE_URL"] = self.env.get("SLUICE_URL") or self.url
        if self.ca_bundle is not None:
            env.setdefault("SLUICE_CA_BUNDLE", str(self.ca_bundle))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _devices_folder(self) -> Path:
        """Where this machine's GPU claims are kept, as its worker host agent finds them too."""
        env = self._child_env()
        return devices_folder(env, env["SLUICE_CACHE_DIR"])

    def _popen(self, argv: list[str], log_path: Path,
               extra: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # Each part ends with this process, however it ends (a SIGKILL, the OOM killer): the
            # kernel sends it SIGTERM. Started from the thread that lives as long as the stack (the
            # caller's, or the supervisor's), as the parent-death signal follows the starting thread.
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**self._child_env(), **(extra or {})},
                cwd=self.data_dir,
                start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
            )

    def _spawn(self, name: str, argv: list[str], is_worker: bool = False) -> Child:
        assert self.data_dir is not None
        log_path = self.data_dir / "logs" / f"{name}.log"
        child = Child(name, self._popen(argv, log_path), log_path, argv, is_worker)
        self.children.append(child)
        return child

    def restart_dead_workers(self) -> list[str]:
        """Start again, under the same node name, every worker node whose process has exited.

        A node is one process (Celery's solo pool), so a predictor that is killed (out of memory)
        takes its node with it; the new node first gives back what the old one held.
        """
        restarted: list[str] = []
        with self._lock:
            if self._stopping:
                return restarted
            for child in self.children:
                if child.is_worker and self._died(child):
                    with open(child.log_path, "ab") as log:
                        note = f"\n[sluice] {child.name} exited with {child.process.returncode}; restarting\n"
                        log.write(note.encode())
                    child.process = self._popen(child.argv, child.log_path)
                    child.restarts += 1
                    restarted.append(child.name)
        return restarted

    def _supervise(self) -> None:
        while not self._stop_supervising.wait(SUPERVISE_INTERVAL_S):
            if self.supervise:
                self.restart_dead_workers()
            if self.replicas is not None:
                with self._lock:
                    if self._stopping:
                        continue
                    try:
                        if self.host is not None:
                            self.host.heartbeat(time.time())
                        self.replicas.step(time.time())
                    except Exception as e:  # noqa: BLE001 - a bad turn must not end supervision of the others
                        print(f"[sluice] replica manager: {type(e).__name__}: {e}", file=sys.stderr)

    def _claim_data_dir(self) -> None:
        """Hold the data folder for this stack's life; refuse one another stack holds; `fresh` empties it."""
        import fcntl

        assert self.data_dir is not None
        lock_path = self.data_dir / DATA_LOCK
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_path.read_text().strip() or "?"
            os.close(fd)
            raise DataDirInUse(f"another sluice up (pid {holder}) uses {self.data_dir}: stop it, or give this one "
                               "another --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._data_lock = fd
        if self.fresh:
            for entry in self.data_dir.iterdir():
                if entry.name == DATA_LOCK:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)

    def _release_data_dir(self) -> None:
        if self._data_lock is not None:
            os.close(self._data_lock)
            self._data_lock = None

    def _exited(self, what: str, child: Child) -> NotReady:
        """A part that stopped while starting, with the cause from its own output and where its log is kept."""
        return NotReady(f"{what} exited: {cause_of(child.log_tail())} (its log: {child.log_path})\n{child.log_tail()}")

    # -- parts ------------------------------------------------------------------------------
    def _start_redis(self) -> None:
        if shutil.which("redis-server") is None:
            raise NotReady("redis-server is not installed (apt-get install -y redis-server), "
                           "and SLUICE_REDIS_URL is not set")
        assert self.data_dir is not None
        redis_dir = self.data_dir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        port = self._redis_port(redis_dir / "port")
        self._spawn("redis", [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(redis_dir),
            # An append-only file, fsynced every second: a restarted redis-server loses at most a
            # second of what it acknowledged (RDB snapshots are off: the AOF is enough).
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "yes",
        ])
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        client = redis_client(self.redis_url, HEARTBEAT)
        redis_child = self.children[-1]
        try:
            # A large append-only file takes a while to load: Redis answers LOADING meanwhile.
            _wait_until(lambda: self._died(redis_child) or client.ping(), 60, "redis-server")
        finally:
            if self._died(redis_child):
                raise self._exited("redis-server", redis_child)

    @staticmethod
    def _redis_port(kept: Path) -> int:
        """The private Redis's port: the one this data folder's Redis had before, while it is free, so
        that what points at it (Flower's `--broker`, a second terminal's SLUICE_REDIS_URL) works again
        after a restart; else a free one, kept for the next start."""
        with contextlib.suppress(OSError, ValueError):
            port = int(kept.read_text())
            if port_is_free(port):
                return port
        port = free_port()
        with contextlib.suppress(OSError):
            kept.write_text(f"{port}\n")
        return port

    def add_worker(self, name: str | None = None, queues: tuple[str, ...] | None = None) -> Child:
        """Start one more worker node (one predictor process) and wait until it is registered."""
        started = self._spawn_worker(name, queues)
        self._wait_for_workers([started])
        return started[0]

    def _spawn_worker(self, name: str | None = None, queues: tuple[str, ...] | None = None) -> tuple[Child, str]:
        """Start a worker node without waiting for it; the child and its Celery node name."""
        self._worker_count += 1
        name = name or f"worker{self._worker_count}"
        node = f"{name}@{socket.gethostname()}"
        child = self._spawn(name, [
            sys.executable, "-m", "celery", "-A", "jobs", "worker", "-Q", ",".join(queues or self.queues),
            "-n", node, "--loglevel", self.worker_loglevel, "--without-gossip", "--without-mingle",
        ], is_worker=True)
        return child, node

    def _wait_for_workers(self, started: list[tuple[Child, str]], timeout: float = 60) -> None:
        """Wait until every node started has registered itself (its own heartbeat in Redis); a node
        that exits first fails the start at once, with its log."""
        if not started:
            return
        client = redis_client(self.redis_address, HEARTBEAT)
        pending = list(started)

        def all_registered() -> bool:
            for child, node in list(pending):
                if client.hexists(keys.NODES, node):
                    pending.remove((child, node))
                elif self._died(child):
                    raise self._exited(f"worker {child.name}", child)
            return not pending

        _wait_until(all_registered, timeout, "worker nodes " + ", ".join(child.name for child, _ in started))

    @property
    def room(self) -> str:
        """The room the stack's worker host and replica host share: one machine, counted once."""
        return f"{socket.gethostname()}-{self.port}"

    @property
    def worker_host_id(self) -> str:
        """The placement name of the stack's worker host (with `worker_host`)."""
        return f"{socket.gethostname()}-{self.port}-workers"

    def _spawn_worker_host(self) -> Child:
        """`sluice workers` offering the stack's room to worker nodes, keeping at least `workers` of them."""
        offers = self.offers or machine_resources()
        return self._spawn("workers", [
            sys.executable, "-m", "sluice.cli", "workers", "--queues", ",".join(self.queues),
            "--min-nodes", str(self.workers), "--idle-grace", str(self.idle_grace_s), "--host-id", self.worker_host_id,
            "--cpu", f"{offers.cpu_m}m", "--mem", str(offers.mem), "--gpu", str(offers.gpu), "--inf", str(offers.inf),
            "--room", self.room,
        ])

    def _wait_for_agent_nodes(self, agent: Child, timeout: float = 60) -> None:
        """Wait until the agent's first `workers` nodes have registered; its exit fails the start, with its log."""
        client = redis_client(self.redis_address, HEARTBEAT)
        prefix = f"{self.worker_host_id}-"

        def registered() -> bool:
            if self._died(agent):
                raise self._exited("the worker host", agent)
            names = [text(n) for n in client.hkeys(keys.NODES)]
            return len([n for n in names if n.startswith(prefix)]) >= self.workers

        _wait_until(registered, timeout, f"{self.workers} worker node(s) of the worker host")

    def worker_nodes(self) -> list[str]:
        """The live worker nodes' Celery names (the stack's own, or its worker host's)."""
        client = redis_client(self.redis_address, HEARTBEAT)
        return sorted(text(n) for n in client.hkeys(keys.NODES))

    @staticmethod
    def _died(child: Child) -> bool:
        return child.process.poll() is not None

    def _start_beat(self) -> None:
        assert self.data_dir is not None
        self._spawn("beat", [
            sys.executable, "-m", "celery", "-A", "jobs", "beat", "--loglevel", "INFO",
            "-s", str(self.data_dir / "beat-schedule"),
        ])

    def _spawn_api(self) -> Child:
        if self.proxy and self.api_port is None:
            self.api_port = free_port()
        return self._spawn("api", [
            sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_config",
            "-b", f"127.0.0.1:{self.api_port or self.port}", "-w", str(self.api_processes), *no_control_socket(),
            "api:create_app()",
        ])

    def _wait_for_api(self, child: Child) -> None:
        healthz = f"{self.management_url}/healthz"
        _wait_until(lambda: self._died(child) or requests.get(healthz, timeout=2).ok, 60, "the API")
        if self._died(child):
            raise self._exited("the API", child)

    def _spawn_proxy(self) -> Child:
        """haproxy on the public port, its config kept by `sluice proxy` from the registry and replicas."""
        if shutil.which("haproxy") is None:
            raise NotReady("haproxy is not installed (apt-get install -y haproxy)")
        tls = ["--tls-cert", str(self.tls_cert), "--tls-key", str(self.tls_key)] if self.tls else []
        return self._spawn("proxy", [
            sys.executable, "-m", "sluice.cli", "proxy", "--port", str(self.port), "--bind", "127.0.0.1",
            "--management", f"127.0.0.1:{self.api_port}", *tls,
        ])

    def _make_certificate(self) -> None:
        """With `self_signed`: the CA and the certificate the proxy serves, made (or kept) in the data folder."""
        assert self.data_dir is not None
        made = make_self_signed(self.data_dir / "tls", ["localhost", "127.0.0.1", "::1", socket.gethostname(),
                                                         socket.getfqdn()])
        self.tls_cert, self.tls_key, self.ca_bundle = made.cert, made.key, made.ca

    def _wait_for_proxy(self, child: Child) -> None:
        """The management API's health answered through the proxy (so wait for the API first).

        Over TLS the certificate is not checked here: the question is only whether the stack's own
        proxy, on loopback, answers; a certificate naming the public host name need not name 127.0.0.1.
        """
        def answered() -> bool:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", InsecureRequestWarning)
                return requests.get(f"{self.url}/healthz", timeout=2, verify=not self.tls).ok

        _wait_until(lambda: self._died(child) or answered(), 60, "the proxy")
        if self._died(child):
            raise self._exited("the proxy", child)

    def _spawn_launcher(self, api_name: str, port: int, devices: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """`sluice serve` for one replica of an API; it binds ports `port` and `port + 1` on loopback, and
        sees only its own GPUs (`devices`)."""
        assert self.data_dir is not None
        return self._popen([
            sys.executable, "-m", "sluice.cli", "serve", api_name, "--port", str(port), "--host", "127.0.0.1",
            "--api-url", self.url, "--state-dir", str(self.data_dir / "replicas"),
            *(["--placement-host", self.host.host_id] if self.host is not None else []),
        ], self.data_dir / "logs" / f"replica-{api_name}.log", devices)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Stack:
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="sluice-"))
            self._own_data_dir = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._claim_data_dir()
        try:
            if self.proxy and not port_is_free(self.port):
                raise NotReady(f"port {self.port} is in use by another program: choose another with --port "
                               f"(sluice up --port {self.port + 1})")
            if self.self_signed and self.proxy:
                self._make_certificate()
            if not self.redis_url and not self.redis_address.sentinels:
                self._start_redis()
            # Every part needs only Redis, so all start at once (each is a Python process that spends
            # seconds importing); then each one's own readiness is awaited.
            api = self._spawn_api()
            proxy = self._spawn_proxy() if self.proxy else None
            if self.beat:
                self._start_beat()
            workers = [] if self.worker_host else [self._spawn_worker() for _ in range(self.workers)]
            agent = self._spawn_worker_host() if self.worker_host else None
            self._wait_for_api(api)
            if proxy is not None:
                self._wait_for_proxy(proxy)
            self._wait_for_workers(workers)
            if agent is not None:
                self._wait_for_agent_nodes(agent)
            if self.realtime:
                client = redis_client(self.redis_address, HEARTBEAT)
                self.host = HostAgent(RedisHostDirectory(client), RedisReplicaAssignments(client),
                                      host_id=f"{socket.gethostname()}:{self.port}", address="127.0.0.1",
                                      offers=self.offers or machine_resources(), hardware=self.hardware,
                                      every_s=host_heartbeat_s(Settings.from_env(self._child_env()).host_ttl_s),
                                      room=self.room if self.worker_host else "")
                offered = self.offers or machine_resources()
                self.replicas = ReplicaManager(RedisApiRegistry(client), self._spawn_launcher,
                                               select=on_hardware(self.hardware), assigned=self.host.assigned,
                                               devices=HostDevices(self._devices_folder(),
                                                                   host_gpus(offered.gpu, self._child_env())),
                                               cores=HostDevices(self._devices_folder(),
                                                                 host_cores(offered.inf, self._child_env()),
                                                                 kind=NEURON))
                self.host.heartbeat(time.time())
                self.replicas.step(time.time())
        except BaseException:
            self._start_failed = True
            self.stop()
            raise
        if self.supervise or self.replicas is not None:
            self._stop_supervising.clear()
            self._supervisor = threading.Thread(target=self._supervise, name="sluice-supervisor", daemon=True)
            self._supervisor.start()
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Stop every child, workers first (they finish or hand back their batch), Redis last."""
        with self._lock:
            self._stopping = True
        self._stop_supervising.set()
        if self._supervisor is not None:
            self._supervisor.join()
            self._supervisor = None
        # The proxy first: everything stops, so no replica has to drain for it (a replica drains
        # until every live proxy has settled without it, which an old haproxy worker holding
        # idle keep-alive connections delays by up to their timeout).
        killed = stop_trees([(child.name, child.process.pid) for child in self.children
                             if child.name == "proxy" and child.process.poll() is None], grace)
        if self.host is not None:
            self.host.leave()
            self.host = None
        if self.replicas is not None:
            self.replicas.stop()
            self.replicas = None
        # Every part but Redis, each with all it started (a worker host's nodes and their environment
        # processes, a launcher's replica): they finish or hand back their work while Redis is still
        # there to take it. Redis last. What outlives the grace is killed, and named.
        killed += stop_trees([(child.name, child.process.pid) for child in self.children
                              if child.name != "redis" and child.process.poll() is None], grace)
        killed += stop_trees([(child.name, child.process.pid) for child in self.children
                              if child.name == "redis" and child.process.poll() is None], grace)
        for child in self.children:
            child.process.wait()
        if killed:
            self._note(f"still running {grace:.0f} s after being asked to stop, so killed:\n  " + "\n  ".join(killed))
        self.children.clear()
        self._stopping = False
        self._release_data_dir()
        # A temporary folder goes, unless asked to stay or the start failed (its logs say why).
        if (self._own_data_dir and self.data_dir is not None and not os.environ.get("SLUICE_KEEP_DATA")
                and not self._start_failed):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _note(self, text: str) -> None:
        """A line about the stack itself, kept in its logs folder (`stack.log`) and shown on stderr where
        stderr is still there (a terminal's `| tee` may have ended with the Ctrl-C that stops the stack)."""
        line = f"[sluice] {text}\n"
        if self.data_dir is not None:
            with contextlib.suppress(OSError):
                (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
                with open(self.data_dir / "logs" / "stack.log", "a") as log:
                    log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}")
        with contextlib.suppress(OSError):
            sys.stderr.write(line)
            sys.stderr.flush()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        parts = [f"----- {c.name} -----\n{c.log_tail()}" for c in self.children]
        if self.data_dir is not None:
            for path in sorted((self.data_dir / "logs").glob("replica-*.log")):
                parts.append(f"----- {path.stem} -----\n{_tail(path)}")
        return "\n".join(parts)
