"""The replica launcher's decisions, step by step: rolling a redeploy, restarting a dead gunicorn,
stopping; and the manager of launchers. Its pure pieces are tested fast in
tests/unit/test_replica_launcher.py.

Processes are real (`sleep` stands in for gunicorn and for `sluice serve`), Redis is real; only
the bundle store and the proxy's routing answer are stand-ins.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from foundation.api_registry import RedisApiRegistry
from foundation.replica_directory import RedisReplicaDirectory
from foundation.replica_scale import RedisScaleBook, ReplicaScale
from predictors_runtime.config import ApiConfig
from sluice.replica import ReplicaLauncher, deployment_identity
from sluice.replica_manager import ReplicaManager
from tests.unit.test_replica_launcher import _config

pytestmark = pytest.mark.integration


def test_a_config_only_redeploy_through_the_registry_is_a_new_deployment(redis_client):
    registry = RedisApiRegistry(redis_client)
    first = registry.put(_config(), "ab" * 32)
    assert deployment_identity(registry.put(_config(), "ab" * 32)) == deployment_identity(first)
    assert deployment_identity(registry.put(_config(config={"k": 1}), "ab" * 32)) != deployment_identity(first)
    assert deployment_identity(registry.put(_config(), "cd" * 32)) != deployment_identity(first)


# -- the launcher, step by step ------------------------------------------------------------------
class FolderBundles:
    """Stands in for BundleStore: each bundle is a folder holding a `.env`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.held: list[str] = []

    def local_folder(self, digest: str) -> Path:
        folder = self.root / digest
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ".env").write_text(f"BUNDLE={digest[:4]}\n")
        self.held.append(digest)
        return folder

    def release(self, digest: str) -> None:
        self.held.remove(digest)


class Proxy:
    """Stands in for the proxy's routing answer."""

    def __init__(self) -> None:
        self.routed: set[str] = set()

    def unrouted(self, _redis: Any, replica_id: str, _now: float) -> bool:
        return replica_id not in self.routed


@pytest.fixture
def spawned() -> list[tuple[list[str], dict[str, str], Path, subprocess.Popen]]:
    return []


@pytest.fixture
def launcher_for(redis_client, tmp_path: Path, spawned):
    made: list[ReplicaLauncher] = []

    def spawn(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        spawned.append((argv, env, cwd, process))
        return process

    def make(name: str = "echo", **kwargs: Any) -> tuple[ReplicaLauncher, Proxy]:
        proxy = Proxy()
        launcher = ReplicaLauncher(
            name, redis_client=redis_client, bundles=FolderBundles(tmp_path / "bundles"),  # type: ignore[arg-type]
            state_root=tmp_path / "state", port=kwargs.pop("port", 9100),
            base_env={"PATH": os.environ["PATH"], **kwargs.pop("more_env", {})},
            unrouted=proxy.unrouted, spawn=spawn, **kwargs,
        )
        made.append(launcher)
        return launcher, proxy

    yield make
    for launcher in made:
        launcher.close()
    for *_, process in spawned:
        if process.poll() is None:
            process.kill()
            process.wait()


def _mark_ready(launcher_gen) -> None:
    # The markers count processes that are alive: this test process stands in for gunicorn's workers.
    launcher_gen.markers.mark_ready(os.getpid())


def _records(redis_client) -> dict[str, Any]:
    return {r.replica_id: r for r in RedisReplicaDirectory(redis_client).all()}


def test_a_replica_is_announced_not_ready_until_every_process_has_built(redis_client, launcher_for, spawned):
    RedisApiRegistry(redis_client).put(_config(), "aa" * 32)
    launcher, _ = launcher_for()
    launcher.start(100.0)
    launcher.step(100.0)
    (argv, env, cwd, _process), = spawned
    gen = launcher.serving
    assert gen is not None and gen.port == 9100 and "127.0.0.1:9100" in argv
    # gunicorn starts in the replica's state folder (a project's own `api.py` must not be found
    # for Sluice's `api`); the predictor's namespace moves into the project folder.
    assert cwd == gen.state_dir and env["SLUICE_REPLICA_PROJECT"] == str(gen.project_dir) and env["BUNDLE"] == "aaaa"
    assert (gen.state_dir / "spec.json").is_file()
    record = _records(redis_client)[gen.replica_id]
    assert (record.api, record.port, record.ready, record.draining) == ("echo", 9100, False, False)
    _mark_ready(gen)
    launcher.step(100.5)
    assert _records(redis_client)[gen.replica_id].ready


def test_a_replica_given_a_gpu_by_its_host_runs_its_processes_on_it_and_says_which(redis_client, launcher_for,
                                                                                    spawned):
    RedisApiRegistry(redis_client).put(ApiConfig.from_dict({
        "name": "echo", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"}, "compute": {"gpu": 1}}),
        "aa" * 32)
    launcher, _ = launcher_for(more_env={"CUDA_VISIBLE_DEVICES": "2", "NVIDIA_VISIBLE_DEVICES": "2"})
    launcher.start(100.0)
    launcher.step(100.0)
    (_argv, env, _cwd, _process), = spawned
    assert env["CUDA_VISIBLE_DEVICES"] == env["NVIDIA_VISIBLE_DEVICES"] == "2"
    assert _records(redis_client)[launcher.serving.replica_id].devices == "2"


def test_a_redeploy_starts_the_new_bundle_on_the_other_port_and_drains_the_old_one_once_ready(
    redis_client, launcher_for, spawned,
):
    registry = RedisApiRegistry(redis_client)
    registry.put(_config(), "aa" * 32)
    launcher, proxy = launcher_for()
    launcher.start(100.0)
    old = launcher.serving
    _mark_ready(old)
    launcher.step(100.0)
    proxy.routed.add(old.replica_id)

    registry.put(_config(), "bb" * 32)
    launcher.step(101.0)
    new = launcher.incoming
    assert new is not None and new.port == 9101 and new.api.bundle == "bb" * 32
    assert new.replica_id != old.replica_id and len(spawned) == 2
    records = _records(redis_client)
    assert records[old.replica_id].ready and not records[old.replica_id].draining
    assert not records[new.replica_id].ready

    launcher.step(102.0)  # the new one still building: nothing changes
    assert launcher.serving is old and not _records(redis_client)[old.replica_id].draining

    _mark_ready(new)
    launcher.step(103.0)
    assert launcher.serving is new and launcher.retiring == [old]
    records = _records(redis_client)
    assert records[new.replica_id].ready and records[old.replica_id].draining
    assert old.process.poll() is None  # still routed by the proxy: kept running

    proxy.routed = {new.replica_id}
    launcher.step(104.0)
    assert old.process.wait(timeout=10) == -signal.SIGTERM
    launcher.step(104.5)
    assert set(_records(redis_client)) == {new.replica_id}
    assert not old.state_dir.exists() and launcher.retiring == []
    assert launcher._bundles.held == ["bb" * 32]  # the old bundle may now leave the host's cache

    registry.put(_config(), "cc" * 32)  # the next redeploy goes back to the first port
    launcher.step(105.0)
    assert launcher.incoming is not None and launcher.incoming.port == 9100


def test_a_draining_replica_is_stopped_after_the_cap_even_if_a_proxy_still_routes_it(
    redis_client, launcher_for,
):
    registry = RedisApiRegistry(redis_client)
    registry.put(_config(), "aa" * 32)
    launcher, proxy = launcher_for(drain_cap_s=5.0)
    launcher.start(100.0)
    old = launcher.serving
    proxy.routed.add(old.replica_id)
    registry.put(_config(), "bb" * 32)
    launcher.step(100.0)
    _mark_ready(launcher.incoming)
    launcher.step(101.0)
    launcher.step(105.0)
    assert old.process.poll() is None
    launcher.step(106.1)
    assert old.process.wait(timeout=10) == -signal.SIGTERM


def test_a_failed_redeploy_leaves_the_old_version_serving(redis_client, launcher_for):
    registry = RedisApiRegistry(redis_client)
    registry.put(_config(), "aa" * 32)
    launcher, _ = launcher_for()
    launcher.start(100.0)
    old = launcher.serving
    _mark_ready(old)
    registry.put(_config(), "bb" * 32)
    launcher.step(101.0)
    launcher.incoming.markers.mark_failed("ImportError: no module named torch", os.getpid())
    for t in range(102, 110):
        launcher.step(float(t))
    records = _records(redis_client)
    assert launcher.serving is old and records[old.replica_id].ready and not records[old.replica_id].draining
    assert records[launcher.incoming.replica_id].message == "ImportError: no module named torch"


def _rolled(redis_client, launchers) -> tuple[int, int]:
    """(replicas announced ready and not draining, replicas serving or starting) of the launchers, now;
    a draining replica, on its way out, counts in neither (as a terminating pod in a Deployment's rollout)."""
    records = _records(redis_client)
    gens = [g for launcher in launchers for g in (launcher.serving, launcher.incoming) if g is not None]
    live = [g for g in gens if g.replica_id in records and records[g.replica_id].ready
            and not records[g.replica_id].draining]
    return len(live), len(gens)


def test_a_redeploy_with_max_surge_1_and_max_unavailable_0_replaces_one_replica_at_a_time(
    redis_client, launcher_for,
):
    registry = RedisApiRegistry(redis_client)
    strategy = {"max_surge": 1, "max_unavailable": 0}
    registry.put(ApiConfig.from_dict({"name": "echo", "kind": "RealtimeAPI", "predictor": {"path": "p.py"},
                                      "update_strategy": strategy}), "aa" * 32)
    RedisScaleBook(redis_client).set("echo", ReplicaScale(desired=3, in_flight=0.0, decided_at=100.0))
    launchers = [launcher_for(port=port)[0] for port in (9100, 9200, 9300)]
    for launcher in launchers:
        launcher.start(100.0)
        _mark_ready(launcher.serving)
        launcher.step(100.0)
    assert _rolled(redis_client, launchers) == (3, 3)

    registry.put(ApiConfig.from_dict({"name": "echo", "kind": "RealtimeAPI", "predictor": {"path": "p.py"},
                                      "update_strategy": strategy}), "bb" * 32)
    seen, now = [], 101.0
    while any(launcher.serving.api.bundle != "bb" * 32 or launcher.incoming or launcher.retiring
              for launcher in launchers):
        for launcher in launchers:
            launcher.step(now)
            seen.append(_rolled(redis_client, launchers))
            if launcher.incoming is not None:
                _mark_ready(launcher.incoming)  # it builds in one step here
            for gen in launcher.retiring:
                gen.drain_now = True  # no proxy routes it any more
        now += 1.0
        assert now < 200, "the redeploy did not finish"
    # Never fewer than the three wanted ready, never more than four running; one at a time.
    assert min(ready for ready, _ in seen) >= 3
    assert max(running for _, running in seen) <= 4
    assert all(launcher.serving.api.bundle == "bb" * 32 for launcher in launchers)
    # Every slot given back.
    assert all(launcher.rollout is None for launcher in launchers)
    assert sum(redis_client.zcard(key) for key in redis_client.scan_iter("sluice:rollout:*")) == 0


def test_with_max_surge_0_an_old_replica_drains_first_and_a_failed_new_one_holds_the_others_back(
    redis_client, launcher_for,
):
    registry = RedisApiRegistry(redis_client)
    strategy = {"max_surge": 0, "max_unavailable": 1}
    config = {"name": "echo", "kind": "RealtimeAPI", "predictor": {"path": "p.py"}, "update_strategy": strategy}
    registry.put(ApiConfig.from_dict(config), "aa" * 32)
    RedisScaleBook(redis_client).set("echo", ReplicaScale(desired=2, in_flight=0.0, decided_at=100.0))
    (first, _), (second, _) = launcher_for(port=9100), launcher_for(port=9200)
    for launcher in (first, second):
        launcher.start(100.0)
        _mark_ready(launcher.serving)
        launcher.step(100.0)
    old_first, old_second = first.serving, second.serving

    registry.put(ApiConfig.from_dict(config), "bb" * 32)
    first.step(101.0)
    second.step(101.0)
    # The first took the one unavailable slot: its old replica drains at once while the new one starts.
    assert first.rollout is not None and first.rollout[2] == "unavailable"
    assert first.retiring == [old_first] and first.serving.api.bundle == "bb" * 32
    assert _records(redis_client)[old_first.replica_id].draining
    # The second waits, its old replica serving.
    assert second.serving is old_second and second.incoming is None and second.rollout is None

    # The new replica fails to build: the slot stays held, so the second never starts replacing its own.
    first.serving.markers.mark_failed("ImportError: no module named torch", os.getpid())
    for t in range(102, 110):
        first.step(float(t))
        second.step(float(t))
    assert second.serving is old_second and second.rollout is None
    assert _records(redis_client)[old_second.replica_id].ready


def test_a_dead_gunicorn_is_started_again_on_the_same_port(redis_client, launcher_for, spawned):
    RedisApiRegistry(redis_client).put(_config(), "aa" * 32)
    launcher, _ = launcher_for()
    launcher.start(100.0)
    gen = launcher.serving
    first = gen.process
    first.kill()
    first.wait()
    launcher.step(200.0)
    assert len(spawned) == 2 and gen.process is not first and gen.port == 9100
    assert spawned[1][0] == spawned[0][0] and gen.restarts == 1
    assert _records(redis_client)[gen.replica_id].ready is False


def test_deleting_the_api_stops_its_replicas_at_once_and_removes_their_records(redis_client, launcher_for):
    registry = RedisApiRegistry(redis_client)
    registry.put(_config(), "aa" * 32)
    launcher, proxy = launcher_for()
    launcher.start(100.0)
    gen = launcher.serving
    proxy.routed.add(gen.replica_id)  # a deleted API is not waited for
    launcher.step(100.0)
    registry.delete("echo")
    launcher.step(101.0)
    assert gen.process.wait(timeout=10) == -signal.SIGTERM
    launcher.step(101.5)
    assert launcher.done and _records(redis_client) == {}


def test_stopping_the_launcher_drains_first(redis_client, launcher_for):
    RedisApiRegistry(redis_client).put(_config(), "aa" * 32)
    launcher, proxy = launcher_for()
    launcher.start(100.0)
    gen = launcher.serving
    _mark_ready(gen)
    proxy.routed.add(gen.replica_id)
    launcher.stop(101.0)
    launcher.step(101.0)
    assert _records(redis_client)[gen.replica_id].draining and gen.process.poll() is None
    proxy.routed.clear()
    launcher.step(102.0)
    gen.process.wait(timeout=10)
    launcher.step(102.5)
    assert launcher.done and _records(redis_client) == {}


def test_serving_a_batch_api_is_refused(redis_client, launcher_for):
    from foundation.errors import ConfigError

    RedisApiRegistry(redis_client).put(_config(kind="BatchAPI"), "aa" * 32)
    launcher, _ = launcher_for()
    with pytest.raises(ConfigError, match="BatchAPI"):
        launcher.start(100.0)


# -- the manager of launchers ------------------------------------------------------------------
def test_the_manager_keeps_one_launcher_per_realtime_api_and_lets_deleted_ones_go(redis_client):
    registry = RedisApiRegistry(redis_client)
    registry.put(_config("one"), "aa" * 32)
    registry.put(_config("two"), "aa" * 32)
    registry.put(_config("jobs", kind="BatchAPI"), "aa" * 32)
    started: list[tuple[str, int]] = []

    def spawn(name: str, port: int, devices: dict[str, str]) -> subprocess.Popen:
        started.append((name, port))
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)

    manager = ReplicaManager(registry, spawn)
    try:
        manager.step(100.0)
        assert sorted(api for api, _ in manager.launchers) == ["one", "two"]
        ports = [p for _, port in started for p in (port, port + 1)]
        assert len(set(ports)) == 4

        manager.step(101.0)
        assert len(started) == 2  # nothing new

        (one,) = manager.running("one")
        one.process.kill()
        one.process.wait()
        manager.step(200.0)
        assert started[-1] == ("one", one.port) and manager.running("one")[0].restarts == 1

        registry.delete("two")
        two = manager.running("two")[0].process
        two.terminate()  # a launcher exits on its own once its API is deleted
        two.wait()
        manager.step(201.0)
        manager.step(202.0)
        assert sorted(api for api, _ in manager.launchers) == ["one"] and len(started) == 3
    finally:
        manager.stop(grace=5)
    assert manager.launchers == {}
