"""Memory limits on real process trees (foundation/memory_limits.py): a tree past its limit loses a
process to it, and nothing outside the tree is touched; the same with the watchdog forced on.
Then a realtime replica on a `sluice up`-style stack whose predictor outgrows its `compute.mem`:
its process is stopped, the replica is back and answering, its record says when and why, and
another API's replica keeps its process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import redis
import requests
import yaml

from foundation.api_registry import DeployedApi
from foundation.cgroup_files import mount_of
from foundation.cpu_limits import CpuLimits
from foundation.memory_limits import ARBITER_BYTES, OWN_MARGIN_BYTES, LimitMode, MemoryLimits
from foundation.proxy_registry import RedisProxyRegistry, routed_everywhere
from foundation.replica_directory import RedisReplicaDirectory
from predictors_runtime.config import ApiConfig
from sluice.embedded import free_port
from testbed.waiting import wait_for

from .conftest import closing_client

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024

# Grows by 10 MiB every 20 ms up to `size` MiB, then waits to be stopped.
GROWER = textwrap.dedent("""
    import sys, time
    held = []
    for _ in range(int(sys.argv[1]) // 10):
        held.append(bytearray(10 * 1024 * 1024))
        time.sleep(0.02)
    time.sleep(60)
""")


def grow(size_mib: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", GROWER, str(size_mib)])


@pytest.fixture
def limits() -> MemoryLimits:
    found = MemoryLimits.from_env({})
    if found.mode is LimitMode.WATCHDOG:
        pytest.skip(f"no writable control group here: {found.reason}")
    return found


def test_a_tree_past_its_cgroup_limit_loses_a_process_and_nothing_else_is_touched(limits):
    group = limits.group("grower", 100 * MIB)
    assert group is not None
    neighbour = grow(150)  # outside the group: as large, and untouched
    grower = grow(300)
    try:
        group.join(grower.pid)
        assert grower.wait(30) == -9  # SIGKILL, from the kernel's OOM killer of the group
        assert group.oom_kills() == 1
        assert 90 * MIB <= group.peak() <= 101 * MIB
        assert neighbour.poll() is None
    finally:
        neighbour.kill()
        group.close()
    assert not limits.base or not (limits.base / "sluice-grower").exists()


def test_the_watchdog_stops_the_largest_process_of_a_tree_past_its_limit_and_nothing_else():
    watched = MemoryLimits.from_env({"SLUICE_MEMORY_LIMITS": "watchdog"})
    assert watched.mode is LimitMode.WATCHDOG
    group = watched.group("grower", 100 * MIB)
    assert group is not None
    neighbour = grow(150)
    grower = grow(300)
    try:
        group.join(grower.pid)
        wait_for(lambda: group.check() or grower.poll() is not None, 30, "the watchdog to stop the grower")
        assert grower.wait(5) == -9 and group.oom_kills() == 1
        assert group.peak() > 100 * MIB
        assert neighbour.poll() is None
    finally:
        neighbour.kill()
        group.close()


def test_compute_cpu_is_written_as_the_groups_weight_and_with_a_quota_as_its_cap_too():
    shares = CpuLimits.from_env({})
    if shares.version == 0:
        pytest.skip(f"no writable cpu controller here: {shares.reason}")
    quota = CpuLimits.from_env({"SLUICE_CPU_LIMITS": "quota"})
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    one, three = shares.group("one", 1000), quota.group("three", 3000)
    try:
        assert one is not None and three is not None
        one.join(busy.pid)
        assert int(one.weight_file.read_text()) == (100 if shares.version == 2 else 1024)
        assert int(three.weight_file.read_text()) == (300 if quota.version == 2 else 3072)
        cap = (three.path / "cpu.max").read_text().split()[0] if quota.version == 2 else \
            (three.path / "cpu.cfs_quota_us").read_text().strip()
        assert int(cap) == 300_000  # 3 cpus of each 100 ms period
        assert str(one.path).split("/sys/fs/cgroup/", 1)[-1].split("/", 1)[-1] in Path(
            f"/proc/{busy.pid}/cgroup").read_text()
    finally:
        busy.kill()
        busy.wait()
        for group in (one, three):
            if group is not None:
                group.close()
        shares.close()
        quota.close()


def test_an_unknown_mode_is_refused_naming_the_setting():
    with pytest.raises(Exception, match="SLUICE_MEMORY_LIMITS must be auto, cgroup, watchdog or off"):
        MemoryLimits.from_env({"SLUICE_MEMORY_LIMITS": "strict"})


def test_sluices_own_part_of_a_replica_stays_within_the_margins_it_is_given(tmp_path):
    """The margins added to compute.mem are measured, not guessed: a replica serving a predictor that
    holds nothing, after 200 requests, fits in them."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "predictor.py").write_text("class PythonPredictor:\n    def __init__(self, config):\n        pass\n\n"
                                          "    def predict(self, payload):\n        return payload\n")
    spec = tmp_path / "spec.json"
    api = ApiConfig.from_dict({"name": "m", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"}})
    spec.write_text(json.dumps(DeployedApi.of(api, "b1").to_dict()))
    port = free_port()
    env = {**os.environ, "SLUICE_REPLICA_SPEC": str(spec), "SLUICE_REPLICA_PROJECT": str(project),
           "SLUICE_REPLICA_STATE_DIR": str(tmp_path / "state"), "SLUICE_CACHE_DIR": str(tmp_path / "cache")}
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "--pythonpath", str(ROOT),
         "api.realtime:create_replica_app()"], cwd=project, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        def ready() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/m", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False
        wait_for(ready, 60, "the replica")
        with requests.Session() as session:
            for n in range(200):
                session.post(f"http://127.0.0.1:{port}/m", json={"n": n}, timeout=10)
        arbiter = psutil.Process(process.pid)
        [worker] = arbiter.children()
        assert arbiter.memory_info().rss < ARBITER_BYTES
        assert worker.memory_info().rss < OWN_MARGIN_BYTES
    finally:
        process.terminate()
        process.wait(30)


# -- a realtime replica ----------------------------------------------------------------------------
HUNGRY_PREDICTOR = """
import os
import time


class PythonPredictor:
    def __init__(self, config):
        self.held = []

    def predict(self, payload):
        step = payload.get("step_mib", 10)
        for _ in range(payload.get("grow_mib", 0) // step):
            self.held.append(bytearray(step * 1024 * 1024))
            time.sleep(0.002)  # a model growing as it works, not in one allocation
        time.sleep(payload.get("hold_s", 0))  # long enough for a watchdog's look, where it is one
        return {"pid": os.getpid(), "held_mib": sum(len(b) for b in self.held) >> 20}
"""


def test_a_replica_past_its_compute_mem_is_stopped_alone_and_comes_back(realtime_stack, tmp_path):
    # No idle connection of the test's own holds an old haproxy worker past a reload.
    client = closing_client(realtime_stack.url, timeout=60)
    names = {"hungry": "100m", "calm": "400m"}  # with their compute.cpu
    for name, cpu in names.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "predictor.py").write_text(HUNGRY_PREDICTOR)
        (folder / "cortex.yaml").write_text(yaml.safe_dump([{
            "name": name, "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"},
            "compute": {"cpu": cpu, "mem": "100Mi"}}]))
        client.deploy(folder / "cortex.yaml")
    try:
        for name in names:
            client.wait_ready(name, timeout=120)
        calm_pid = client.predict("calm", {"grow_mib": 0})["pid"]
        hungry_pid = client.predict("hungry", {"grow_mib": 20})["pid"]
        # Each replica's processes have its compute.cpu as their weight, where a cpu controller is writable.
        if CpuLimits.from_env({}).version == 1:
            assert {name: cpu_shares_of(pid) for name, pid in (("hungry", hungry_pid), ("calm", calm_pid))} == {
                "hungry": 102, "calm": 409}

        # Growing as it works: its own guard ends the request out_of_memory before the kernel must (in a
        # memory group: the watchdog, which has no group to read, stops the process as the kernel would).
        guarded = MemoryLimits.from_env(dict(os.environ)).mode in (LimitMode.CGROUP_V1, LimitMode.CGROUP_V2)
        held = post(f"{realtime_stack.url}/hungry", {"grow_mib": 400, "step_mib": 2})
        limit_mib = (100 * MIB + ARBITER_BYTES + OWN_MARGIN_BYTES) // MIB
        if guarded:
            assert held.status_code == 507 and held.json()["kind"] == "out_of_memory", held.text
            assert "the predictor grew past its API's compute.mem" in held.json()["message"]
            assert f"of its limit of {limit_mib} MiB" in held.json()["message"]
        else:
            assert held.status_code == 502, held.text
        replica = wait_for(lambda: stopped(client, 0.0), 30, "the replica's record to say it was stopped for memory")
        assert replica["last_oom"].startswith("a process was stopped for memory: ")
        second_pid = answering_and_routed_again(realtime_stack, "hungry")
        assert second_pid != hungry_pid  # a new process, nothing held

        # In one allocation, past the guard's look: the kernel stops the process; the request gets the
        # proxy's 502 and the record says so too.
        cut = post(f"{realtime_stack.url}/hungry", {"grow_mib": 400, "step_mib": 400, "hold_s": 5})
        assert cut.status_code == 502 and cut.json()["kind"] == "bad_gateway", cut.text
        replica = wait_for(lambda: stopped(client, replica["last_oom_at"]), 30, "the kernel's stop to be recorded")
        assert replica["last_oom"].startswith(f"a process was stopped for memory: over its limit of {limit_mib} MiB")
        third_pid = answering_and_routed_again(realtime_stack, "hungry")
        assert third_pid not in (hungry_pid, second_pid)
        assert client.predict("calm", {"grow_mib": 0})["pid"] == calm_pid      # the other API untouched
        assert requests.get(f"{realtime_stack.url}/healthz", timeout=10).status_code == 200
    finally:
        for name in names:
            client.delete_api(name)


def stopped(client, after: float) -> dict:
    """The hungry replica's record once it says it was stopped for memory after `after` ({} before)."""
    [replica] = client.api("hungry")["replicas"]
    return replica if (replica.get("last_oom_at") or 0) > after else {}


def cpu_shares_of(pid: int) -> int:
    """The cpu.shares of the cgroup v1 cpu group process `pid` is in."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            mount = mount_of("cgroup", "cpu")
            assert mount is not None
            return int((mount / path.lstrip("/") / "cpu.shares").read_text())
    raise AssertionError(f"process {pid} is in no cpu group")


def answering_and_routed_again(stack, name: str) -> int:
    """The pid of the new process of the API's one replica, once the proxy routes to it for good.

    A process answering is not enough: the launcher may have recorded the replica unready while its
    process was replaced, and the proxy may apply that record only after the new process answered
    (the next request then gets 503 not_ready). So: an answer, then the replica's record saying
    ready after it, then every proxy settled on a configuration rendered after that record, routing it.
    """
    pid = wait_for(lambda: _pid_answering(stack.url, name), 120, f"a process of {name} to answer again")
    answered_at = time.time()
    client = redis.Redis.from_url(stack.redis_url)
    try:
        replicas, proxies = RedisReplicaDirectory(client), RedisProxyRegistry(client)
        [record] = wait_for(lambda: [r for r in replicas.live(time.time(), name) if r.ready and r.seen > answered_at],
                            30, f"{name}'s replica to be recorded ready after it answered")
        wait_for(lambda: routed_everywhere([p for p in proxies.live(time.time()) if p.seen > record.seen],
                                           {record.replica_id}),
                 30, f"every proxy to route {record.replica_id} by a configuration rendered since")
    finally:
        client.close()
    return pid


def post(url: str, payload: dict) -> requests.Response:
    """A request on a connection of its own, closed after it: the answer kept by the test holds no idle
    connection to the proxy, which would keep an old haproxy worker (and the proxy unsettled) up to
    the proxy's keep-alive timeout after each reload."""
    return requests.post(url, json=payload, headers={"Connection": "close"}, timeout=60)


def _pid_answering(url: str, name: str) -> int | None:
    """The pid of the replica process that answered, None while it restarts (a 503 or 502 meanwhile)."""
    answer = post(f"{url}/{name}", {"grow_mib": 0})
    return int(answer.json()["pid"]) if answer.status_code == 200 else None

