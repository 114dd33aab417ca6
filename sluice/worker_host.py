"""A worker host's agent (`sluice workers`): keeps this host's worker nodes, as many as jobs want.

It runs at least `--min-nodes` nodes (each a `celery -A jobs worker` process, one predictor
process: the app's `worker_concurrency` is 1) and announces every step what the host offers
(`foundation.hosts.HostRecord`, role "workers") and which nodes it runs (`WorkerHostReport`). Beat
plans from that (`jobs/placement/node_plan.py`): when jobs want more nodes than run, it asks hosts with room
for more, and the agent starts them. A node above the minimum that beat's plan has not seen busy
for `--idle-grace` seconds is stopped with Celery's warm shutdown (SIGTERM: a batch it runs is
finished first), so an idle host gives its room back. A node that dies is started again under the
same name, so it settles what its previous life held (`jobs/transport/settle.py`). Without a fresh plan (beat
stopped) the agent holds what it runs.

`WorkerHost.step(now)` is one turn of the loop, driven with a fixed clock in tests; the processes
are made by a `spawn` function (`celery_node` here, a fake in unit tests).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis

from foundation.cpu_limits import WEIGHT_FILE_VARIABLE, CpuGroup, CpuLimits
from foundation.devices import NEURON, HostDevices, devices_folder, host_cores, host_gpus
from foundation.errors import SluiceError
from foundation.hosts import HostDirectory, HostRecord, Resources, memory_found
from foundation.memory_limits import LIMIT_FILE_VARIABLE, LimitMode, MemoryGroup, MemoryLimits, human_bytes
from foundation.processes import die_with_parent
from jobs.batch.job import JobStatus
from jobs.nodes.registry import NodeRegistry
from jobs.nodes.worker_hosts import WorkerHosts
from jobs.placement.node_plan import HostPlan, WorkerHostReport
from jobs.store.protocols import JobStorage
from jobs.transport.delivery import is_request_entry, parse_inflight_entry

from . import pod_deletion_cost
from .pod_deletion_cost import PodDeletionCost

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
WORKERS_ROLE = "workers"
STEP_S = 0.5
STOP_GRACE_S = 60.0  # how long a stopping agent waits for its nodes' warm shutdown before SIGKILL
_HOST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class BadAgentOption(SluiceError, ValueError):
    """An option of `sluice workers` that cannot be used (no queue, a minimum below 0, a bad host id)."""


class NodeProcess(Protocol):
    """One running worker node, as the agent handles it."""

    @property
    def pid(self) -> int:
        """Its process id (its memory group takes it in)."""

    def poll(self) -> int | None:
        """Its exit status once it has exited, else None."""

    def send_signal(self, sig: int) -> None:
        """Signal it (SIGTERM: Celery's warm shutdown)."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit (subprocess.TimeoutExpired past `timeout`)."""

    def kill(self) -> None:
        """End it at once."""


Spawn = Callable[[str, Mapping[str, str]], NodeProcess]
"""Start a node under this Celery node name, with these variables added to its environment."""


@dataclass(frozen=True)
class AgentConfig:
    """What `sluice workers` was asked for, checked once at the edge."""

    host_id: str
    queues: tuple[str, ...]
    offers: Resources
    min_nodes: int = 1
    idle_grace_s: float = 60.0
    address: str = ""
    pool: str | None = None       # the host pool it belongs to (foundation/host_pools.py)
    stop_grace_s: float = STOP_GRACE_S  # how long a stopping agent waits for its nodes' warm shutdown
    gpus_per_node: int = 1        # on a GPU host: the GPUs each node holds as its own
    inf_per_node: int = 1         # on an Inferentia host: the Neuron cores each node holds as its own
    room: str = ""                # shared with the replica host of the same machine (HostRecord.room)

    def __post_init__(self) -> None:
        if not self.queues:
            raise BadAgentOption("--queues must name at least one hardware queue (cpu, gpu, inf)")
        if self.min_nodes < 0:
            raise BadAgentOption(f"--min-nodes must be 0 or more (got {self.min_nodes})")
        if self.idle_grace_s < 0:
            raise BadAgentOption(f"--idle-grace must be 0 or more seconds (got {self.idle_grace_s})")
        if self.gpus_per_node < 1:
            raise BadAgentOption(f"--gpus-per-node must be 1 or more (got {self.gpus_per_node})")
        if self.inf_per_node < 1:
            raise BadAgentOption(f"--inf-per-node must be 1 or more (got {self.inf_per_node})")
        if self.stop_grace_s <= 0:
            raise BadAgentOption(f"--stop-grace must be above 0 seconds (got {self.stop_grace_s})")
        if self.pool is not None and not _HOST_ID.match(self.pool):
            raise BadAgentOption(f"--pool must be letters, digits, '.', '_' or '-' (got {self.pool!r})")
        if not _HOST_ID.match(self.host_id):
            raise BadAgentOption(f"--host-id must be letters, digits, '.', '_' or '-' (got {self.host_id!r})")

    @property
    def hardware(self) -> str | None:
        """The one kind of hardware its nodes serve ("cpu" or "gpu"), None for several."""
        return self.queues[0] if len(self.queues) == 1 else None


def default_host_id() -> str:
    """This machine's name, marked as its worker host (its replica host announces the bare name)."""
    return f"{socket.gethostname()}-workers"


class WorkerHost:
    """The agent's state: its nodes by name, those stopping, and since when each has been idle."""

    def __init__(self, config: AgentConfig, spawn: Spawn, hosts: HostDirectory, worker_hosts: WorkerHosts,
                 nodes: NodeRegistry, node_host: str | None = None, cost: PodDeletionCost | None = None,
                 memory: MemoryLimits | None = None, records: JobStorage | None = None,
                 cpu: CpuLimits | None = None, devices: HostDevices | None = None,
                 cores: HostDevices | None = None) -> None:
        """`memory` holds each node to the `compute.mem` of the job it runs (foundation/memory_limits.py);
        `records` is where the batch a node stopped for memory held is recorded failed, and its job
        ends `status_worker_oom`."""
        self.config = config
        self._memory = memory or MemoryLimits(LimitMode.OFF, "not asked for")
        self._cpu = cpu or CpuLimits("not asked for")
        # A GPU host's GPUs, `gpus_per_node` handed to each node; a host whose nodes serve other queues
        # too (`sluice up`'s) hands none, or its CPU nodes would hold GPUs.
        self._devices = devices if devices is not None and config.offers.gpu > 0 and config.hardware == "gpu" else None
        self._cores = cores if cores is not None and config.offers.inf > 0 and config.hardware == "inf" else None
        self._waiting_for_devices = False
        self._records = records
        self._groups: dict[str, MemoryGroup] = {}
        self._cpu_groups: dict[str, CpuGroup] = {}
        self._oom_seen: dict[str, int] = {}
        self._cost = cost
        self._spawn = spawn
        self._hosts = hosts
        self._worker_hosts = worker_hosts
        self._nodes = nodes
        self._node_host = node_host or socket.gethostname()
        self.running: dict[str, NodeProcess] = {}
        self.stopping: dict[str, NodeProcess] = {}
        self._idle_since: dict[str, float] = {}

    def _next_name(self) -> str:
        """The lowest free index: a restarted agent's nodes take their predecessors' names (and settle them)."""
        taken = set(self.running) | set(self.stopping)
        k = 1
        while f"{self.config.host_id}-{k}@{self._node_host}" in taken:
            k += 1
        return f"{self.config.host_id}-{k}@{self._node_host}"

    def _start(self, name: str) -> bool:
        """Start node `name` (False: its GPUs are not free yet, and nothing was started)."""
        shown: dict[str, str] = {}
        for book, count, what in ((self._devices, self.config.gpus_per_node, "GPU"),
                                  (self._cores, self.config.inf_per_node, "Neuron core")):
            if book is None:
                continue
            claimed = book.claim(f"node {name}", count)  # kept across its restarts
            if claimed is None:
                if not self._waiting_for_devices:
                    log.warning("node %s waits for %d free %s(s) of this host (free: %s)", name, count, what,
                                ", ".join(book.free()) or "none")
                self._waiting_for_devices = True
                return False
            shown.update(book.visible(claimed))
            log.info("node %s holds %s %s", name, what, ",".join(claimed), extra={"node": name, "devices": claimed})
        self._waiting_for_devices = False
        group, cpu = self._group_of(name), self._cpu_group_of(name)
        extra = {LIMIT_FILE_VARIABLE: str(group.limit_file)} if group is not None else {}
        extra.update(shown)
        if cpu is not None:
            extra[WEIGHT_FILE_VARIABLE] = str(cpu.weight_file)
        process = self.running[name] = self._spawn(name, extra)
        self._idle_since.pop(name, None)
        for joined, what in ((group, "memory limit"), (cpu, "cpu share")):
            if joined is None:
                continue
            try:
                joined.join(process.pid)
            except OSError as e:  # it runs, without it, and says so
                log.error("node %s could not be given its %s (%s); it runs without one", name, what, e)
        return True

    def _cpu_group_of(self, name: str) -> CpuGroup | None:
        """The node's CPU group, kept across its restarts: 1 cpu's weight until the node writes its job's."""
        if name not in self._cpu_groups:
            try:
                group = self._cpu.group(f"node-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}", 1000)
            except OSError as e:
                log.error("node %s gets no cpu group (%s); it runs with the default share", name, e)
                return None
            if group is None:
                return None
            self._cpu_groups[name] = group
        return self._cpu_groups[name]

    def _group_of(self, name: str) -> MemoryGroup | None:
        """The node's memory group, made at its first start and kept across its restarts: at first the
        host's memory, then what the node writes for the job it runs."""
        if name in self._groups:
            return self._groups[name]
        start = self.config.offers.mem or memory_found()
        try:
            group = self._memory.group(f"node-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}", start, swap_too=False)
        except OSError as e:
            log.error("node %s gets no memory group (%s); it runs without a limit", name, e)
            return None
        if group is not None:
            self._groups[name] = group
            self._oom_seen[name] = group.oom_kills()
        return group

    def _watch_memory(self, now: float) -> None:
        """Enforce watched limits, and end the jobs of a node stopped for memory `status_worker_oom`."""
        for name, group in list(self._groups.items()):
            group.check()
            kills = group.oom_kills()
            if kills > self._oom_seen.get(name, 0):
                self._oom_seen[name] = kills
                self._out_of_memory(name, group)

    def _out_of_memory(self, name: str, group: MemoryGroup) -> None:
        """A process of node `name` was stopped for memory: each job whose batch it held ends
        `status_worker_oom`, as on Cortex, its message naming the batch, the limit and the peak."""
        said = (f"over its limit of {human_bytes(group.limit)} (compute.mem and Sluice's own part), peak "
                f"{human_bytes(group.peak())}")
        log.error("node %s: a process was stopped for memory: %s", name, said, extra={"node": name})
        if self._records is None:
            return
        held: dict[str, list[int]] = {}
        for entry in self._nodes.inflight(name).values():
            if is_request_entry(entry):
                continue
            job_id, index = parse_inflight_entry(entry)
            held.setdefault(job_id, []).extend([] if index is None else [index])
        for job_id, indexes in sorted(held.items()):
            batches = ", ".join(str(i) for i in sorted(indexes)) or "its completion"
            message = f"a worker was stopped for memory running batch {batches}: {said}"
            kept = self._records.kept_payloads(job_id, indexes)
            for index in sorted(indexes):  # its items kept with it, for retry_failed_of
                payload, ref = kept.get(index, (None, None))
                self._records.record_failure(job_id, index, 0.0, f"out of memory: {said}", 1, payload, ref)
            if self._records.transition(job_id, JobStatus.WORKER_OOM, message=message):
                log.error("job %s: %s: %s", job_id, JobStatus.WORKER_OOM.value, message, extra={"job_id": job_id})

    def _reap(self) -> None:
        for name, process in list(self.stopping.items()):
            code = process.poll()
            if code is not None:
                del self.stopping[name]
                log.info("node %s stopped (exit status %s)", name, code, extra={"node": name})
                self._forget_group(name)
        for name, process in list(self.running.items()):
            code = process.poll()
            if code is not None:
                log.warning("node %s exited with %s; starting it again", name, code, extra={"node": name})
                self._start(name)

    def _plan(self, now: float) -> HostPlan | None:
        plan = self._worker_hosts.plan_of(self.config.host_id)
        return plan if plan is not None and plan.fresh(now) else None

    def _stop_idle(self, plan: HostPlan, registered: set[str], now: float) -> None:
        """Warm-stop the nodes idle for the grace period that run above the plan and the minimum."""
        for name in self.running:
            if name in registered and name not in plan.busy:
                self._idle_since.setdefault(name, now)
            else:
                self._idle_since.pop(name, None)
        excess = len(self.running) - max(self.config.min_nodes, plan.target)
        # The longest idle first, and among those the newest (highest index): the nodes kept keep the low names.
        idle = sorted((n for n, since in self._idle_since.items() if now - since >= self.config.idle_grace_s),
                      reverse=True)
        idle.sort(key=lambda n: self._idle_since[n])
        for name in idle[:max(excess, 0)]:
            if self._nodes.inflight(name):  # placed since beat looked: its turn comes again later
                self._idle_since[name] = now
                continue
            log.info("node %s idle for %.0f s above %d wanted; stopping it (warm shutdown)", name,
                     now - self._idle_since[name], max(self.config.min_nodes, plan.target), extra={"node": name})
            process = self.running.pop(name)
            self._idle_since.pop(name)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            self.stopping[name] = process

    def step(self, now: float) -> None:
        """One turn: notice nodes stopped for memory, restart dead nodes, start what the plan (or the
        minimum) wants, stop idle excess, announce."""
        self._watch_memory(now)
        self._reap()
        plan = self._plan(now)
        target = max(self.config.min_nodes, plan.target if plan is not None else 0)
        while len(self.running) < target:
            name = self._next_name()
            if not self._start(name):
                break
            log.info("started node %s (%d wanted on this host)", name, target, extra={"node": name})
        if plan is not None:
            self._stop_idle(plan, set(self._nodes.heartbeats()), now)
            if self._cost is not None:
                self._cost.update(held_units(plan), now)
        self.announce(now)

    def _forget_group(self, name: str) -> None:
        """What node `name` held, given back: it stopped for good."""
        for book in (self._devices, self._cores):
            if book is not None:
                book.release(f"node {name}")
        group = self._groups.pop(name, None)
        self._oom_seen.pop(name, None)
        if group is not None:
            group.close()
        cpu = self._cpu_groups.pop(name, None)
        if cpu is not None:
            cpu.close()

    def announce(self, now: float) -> None:
        """The host's record (what it offers) and its report (what it runs, starting ones included)."""
        config = self.config
        self._hosts.announce(HostRecord(config.host_id, config.address or self._node_host, config.offers,
                                        config.hardware, (WORKERS_ROLE,), now, config.pool, config.room))
        self._worker_hosts.report(WorkerHostReport(config.host_id, config.queues, config.min_nodes,
                                                   tuple(sorted(self.running)), now))

    def stop(self, grace: float | None = None) -> None:
        """Warm-stop every node (each finishes the batch it runs), SIGKILL what outlives `grace`
        (default `--stop-grace`); withdraw the host."""
        grace = self.config.stop_grace_s if grace is None else grace
        every = {**self.running, **self.stopping}
        for process in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, process in every.items():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("node %s did not stop within %.0f s; killing it", name, grace)
                process.kill()
                process.wait()
        self.running.clear()
        self.stopping.clear()
        for name in {*self._groups, *self._cpu_groups}:
            self._forget_group(name)
        for book in (self._devices, self._cores):
            if book is not None:
                book.release_all()
        self._memory.close()
        self._cpu.close()
        with contextlib.suppress(redis.RedisError):
            self._hosts.remove(self.config.host_id)
            self._worker_hosts.remove(self.config.host_id)


def held_units(plan: HostPlan) -> int:
    """What a worker host holds, for its pod's deletion cost: its busy nodes, at least 1 while it
    starts nodes for a demand."""
    return max(len(plan.busy), 1 if plan.holds else 0)


def celery_node(queues: tuple[str, ...], env: Mapping[str, str], loglevel: str = "INFO") -> Spawn:
    """Spawn real nodes: `celery -A jobs worker -Q <queues> -n <name>`, as `sluice up` starts them."""
    child_env = dict(env)
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), child_env.get("PYTHONPATH")]))
    child_env.setdefault("PYTHONUNBUFFERED", "1")

    def spawn(name: str, extra: Mapping[str, str]) -> NodeProcess:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "jobs", "worker", "-Q", ",".join(queues), "-n", name,
             "--loglevel", loglevel, "--without-gossip", "--without-mingle"],
            env={**child_env, **extra}, start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
        )

    return spawn


def run_agent(config: AgentConfig, env: Mapping[str, str] | None = None, step_s: float = STEP_S) -> int:
    """`sluice workers`: the agent's loop until SIGTERM/SIGINT, which warm-stops every node; the exit status."""
    from foundation.api_registry import RedisApiRegistry
    from foundation.environment_states import RedisEnvironmentStates
    from foundation.hosts import RedisHostDirectory
    from foundation.redis_clients import heartbeat_client
    from foundation.settings import Settings
    from jobs.nodes.registry import Nodes
    from jobs.nodes.worker_hosts import RedisWorkerHosts
    from jobs.store import JobStore
    from predictors_runtime.bundles import BundleStore
    from predictors_runtime.environments import HostEnvironments
    from predictors_runtime.project import BundleLimits

    from .environment_upkeep import EnvironmentUpkeep

    env = dict(os.environ if env is None else env)
    settings = Settings.from_env(env)
    client = heartbeat_client(settings)  # short timeouts, no retries: the next step is the retry
    memory = MemoryLimits.from_env(env, watch_folder=Path(settings.cache_dir).expanduser() / "memory-limits")
    cpu = CpuLimits.from_env(env)
    log.info("worker host %s: memory limits: %s; cpu: %s", config.host_id, memory.reason, cpu.reason)
    store = JobStore(client, settings.job_ttl_s)
    agent = WorkerHost(config, celery_node(config.queues, env), RedisHostDirectory(client), RedisWorkerHosts(client),
                       Nodes(client, settings.node_ttl_s), cost=pod_deletion_cost.in_pod(env), memory=memory,
                       records=store, cpu=cpu,
                       devices=HostDevices(devices_folder(env, settings.cache_dir), host_gpus(config.offers.gpu, env)),
                       cores=HostDevices(devices_folder(env, settings.cache_dir), host_cores(config.offers.inf, env),
                                         kind=NEURON))
    upkeep = EnvironmentUpkeep(
        HostEnvironments.under(settings.cache_dir, events=RedisEnvironmentStates(client)), RedisApiRegistry(client),
        store, grace_s=settings.environment_grace_s,
        bundles=BundleStore(settings.storage, settings.cache_dir, cache_bytes=settings.bundle_cache_bytes,
                            limits=BundleLimits(settings.max_unpacked_bundle_bytes, settings.max_bundle_files)),
        queues=config.queues)
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("worker host %s: queues %s, at least %d node(s), offering %s", config.host_id, ",".join(config.queues),
             config.min_nodes, config.offers)
    failing = False
    try:
        while not stopping.is_set():
            try:
                agent.step(time.time())
                upkeep.step(time.time())
                failing = False
            except redis.RedisError as e:  # Redis away: the nodes run on; said once, tried every step
                if not failing:
                    log.warning("worker host %s cannot reach Redis: %s", config.host_id, e)
                failing = True
            stopping.wait(step_s)
        return 0
    finally:
        agent.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
