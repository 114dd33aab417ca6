"""The replica launcher's pure pieces: ports, gunicorn's command, the environment, what a
deployment is, restart delays.

Rolling a redeploy, restarting a dead gunicorn, stopping, and the manager of launchers, with real
processes and Redis, are in tests/integration/test_replica_launcher_processes.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from foundation.api_registry import DeployedApi
from foundation.errors import ConfigError
from predictors_runtime.config import ApiConfig
from sluice.cli.render import realtime_status
from sluice.replica import Generation, ReplicaLauncher, alternate_port, deployment_identity, restart_delay_s
from sluice.replica_manager import free_port_pair
from sluice.replica_process import KEEP_ALIVE_WORKER, REPLICA_APP, ROOT, gunicorn_argv, replica_argv, replica_env
from sluice.tls.hosts import HostTls, host_tls


def _config(name: str = "echo", kind: str = "RealtimeAPI", **predictor: Any) -> ApiConfig:
    return ApiConfig.from_dict({"name": name, "kind": kind, "predictor": {"path": "predictor.py", **predictor}})


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_grpc_api_is_served_by_the_grpc_replica_on_the_same_addresses_and_any_other_by_gunicorn():
    grpc = _config(protobuf_path="iris.proto", threads_per_process=8).predictor
    assert replica_argv(grpc, "127.0.0.1:9000", python="py", unix_socket="/run/r.sock") == [
        "py", "-m", "sluice.grpc_replica", "127.0.0.1:9000", "--unix", "/run/r.sock"]
    assert replica_argv(_config().predictor, "h:1", python="py") == gunicorn_argv(_config().predictor, "h:1", "py")
    # A host with a certificate: the gRPC replica serves TLS only, with it.
    assert replica_argv(grpc, "0.0.0.0:9000", python="py", tls=HostTls("/c.pem", "/k.pem")) == [
        "py", "-m", "sluice.grpc_replica", "0.0.0.0:9000", "--tls-cert", "/c.pem", "--tls-key", "/k.pem"]


# -- pure pieces ---------------------------------------------------------------------------------
def test_generations_alternate_between_two_ports():
    assert alternate_port(9000, 9000) == 9001
    assert alternate_port(9000, 9001) == 9000


def test_a_single_threaded_replica_runs_sync_workers_that_keep_connections_with_a_timeout_no_predict_reaches():
    argv = gunicorn_argv(_config(processes_per_replica=3).predictor, "127.0.0.1:9000", python="py")
    assert argv[:7] == ["py", "-m", "gunicorn", "-b", "127.0.0.1:9000", "-w", "3"]
    assert _option(argv, "--worker-class") == "sluice.keepalive_worker.KeepAliveSyncWorker"
    assert int(_option(argv, "--keep-alive")) > 60  # longer than haproxy keeps an idle server connection
    assert "--threads" not in argv and "--preload" not in argv
    assert int(_option(argv, "--timeout")) >= 3600
    assert int(_option(argv, "--graceful-timeout")) >= 30
    assert argv[-1] == REPLICA_APP == "api.realtime:create_replica_app()"


def test_threads_choose_gthread_and_server_side_batching_gevent():
    assert _option(gunicorn_argv(_config().predictor, "h:1"), "--worker-class") == KEEP_ALIVE_WORKER
    threaded = gunicorn_argv(_config(threads_per_process=8).predictor, "h:1")
    assert _option(threaded, "--worker-class") == "gthread" and _option(threaded, "--threads") == "8"
    batching = _config(threads_per_process=16, server_side_batching={"max_batch_size": 8, "batch_interval": "10ms"})
    argv = gunicorn_argv(batching.predictor, "h:1")
    # Requests waiting in a batch are greenlets; idle connections kept alive for the proxy get room besides.
    assert _option(argv, "--worker-class") == "gevent" and _option(argv, "--worker-connections") == "32"
    assert int(_option(argv, "--keep-alive")) > 60


def test_a_long_request_timeout_lengthens_the_graceful_stop():
    argv = gunicorn_argv(_config(request_timeout=90).predictor, "h:1")
    assert _option(argv, "--graceful-timeout") == "90"


def test_sluice_packages_come_before_the_project_on_the_import_path():
    argv = gunicorn_argv(_config().predictor, "h:1")
    assert _option(argv, "--pythonpath") == str(ROOT)


def test_the_replica_environment_layers_dotenv_then_predictor_env_then_the_replica_contract(tmp_path: Path):
    (tmp_path / ".env").write_text("FROM_DOTENV=1\nSHARED=dotenv\nSLUICE_REPLICA_ID=hijack\n")
    config = _config(env={"SHARED": "predictor", "PLAIN": "x"})
    deployed = DeployedApi("echo", "RealtimeAPI", config.to_dict(), "ab" * 32, "cpu", 0.0, [])
    env = replica_env(
        {"PATH": "/bin", "PYTHONPATH": "/extra", "SHARED": "launcher"}, tmp_path, deployed,
        spec_path=tmp_path / "spec.json", markers_dir=tmp_path / "markers", replica_id="echo-1-x",
        api_url="http://proxy:8888/",
    )
    assert env["PATH"] == "/bin" and env["FROM_DOTENV"] == "1"
    assert env["SHARED"] == "predictor" and env["PLAIN"] == "x"
    assert env["SLUICE_REPLICA_ID"] == "echo-1-x"
    assert env["SLUICE_REPLICA_SPEC"] == str(tmp_path / "spec.json")
    assert env["SLUICE_REPLICA_PROJECT"] == str(tmp_path)
    assert env["SLUICE_REPLICA_STATE_DIR"] == str(tmp_path / "markers")
    assert env["SLUICE_API_URL"] == "http://proxy:8888"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/extra"]


def _deployment(config: ApiConfig, bundle: str, deployed_at: float = 0.0) -> DeployedApi:
    """What the registry records for a deploy of `config` with `bundle` at `deployed_at`."""
    return DeployedApi(config.name, config.kind, config.to_dict(), bundle, config.queue, deployed_at,
                       list(config.ignored_fields))


def test_a_config_only_redeploy_is_a_new_deployment():
    first = _deployment(_config(), "ab" * 32, deployed_at=100.0)
    assert deployment_identity(_deployment(_config(), "ab" * 32, deployed_at=200.0)) == deployment_identity(first)
    assert deployment_identity(_deployment(_config(config={"k": 1}), "ab" * 32)) != deployment_identity(first)
    assert deployment_identity(_deployment(_config(), "cd" * 32)) != deployment_identity(first)


def test_a_gunicorn_that_keeps_dying_is_restarted_ever_more_slowly():
    delays = [restart_delay_s(n) for n in range(10)]
    assert delays[0] == 0 and delays == sorted(delays) and delays[-1] == 30


def test_free_port_pairs_leave_out_taken_ports():
    port = free_port_pair()
    again = free_port_pair({port, port + 1})
    assert again not in (port, port + 1) and again + 1 not in (port, port + 1)


# The launcher step by step and the manager of launchers, with real processes and Redis:
# tests/integration/test_replica_launcher_processes.py.


# -- what a replica's record says while it starts --------------------------------------------------
class _Build:
    """What the launcher reads of an environment being built in the background."""

    key, stage, error, finished_at, environment = "env-1", "installing 3 packages", "", 0.0, None

    def __init__(self, done: bool, error: str = "") -> None:
        self._done, self.error = done, error

    def done(self) -> bool:
        return self._done


def _generation(tmp_path: Path) -> Generation:
    deployed = DeployedApi("echo", "RealtimeAPI", _config().to_dict(), "ab" * 32, "cpu", 0.0, [])
    return Generation("echo-1-x", deployed, 9000, tmp_path, tmp_path / "state", {}, ["py"])


def test_a_replica_building_its_environment_or_starting_is_not_ready_and_not_failing(tmp_path: Path):
    gen = _generation(tmp_path)
    gen.environment = _Build(done=False)  # type: ignore[assignment]

    assert ReplicaLauncher._environment_ready(None, gen, now=1.0) is False  # type: ignore[arg-type]
    building = gen.record("127.0.0.1", now=1.0)
    gen.message = "starting"  # what a launch says until every process is ready
    starting = gen.record("127.0.0.1", now=2.0)

    assert (building.ready, building.failing) == (False, False)
    assert building.message == "building its environment env-1: installing 3 packages"
    assert (starting.ready, starting.failing, starting.message) == (False, False, "starting")


def test_a_replica_whose_environment_failed_is_failing_and_says_why(tmp_path: Path):
    gen = _generation(tmp_path)
    gen.environment = _Build(done=True, error="no wheel for sluice-test-broken")  # type: ignore[assignment]

    assert ReplicaLauncher._environment_ready(None, gen, now=1.0) is False  # type: ignore[arg-type]
    record = gen.record("127.0.0.1", now=1.0)

    assert record.failing and "failed: no wheel for sluice-test-broken" in record.message


def test_sluice_get_calls_a_starting_api_starting_and_only_a_failing_one_an_error():
    def api(*replicas: dict[str, Any]) -> dict[str, Any]:
        return {"bundle": "b1", "replicas": [{"bundle": "b1", "draining": False, **r} for r in replicas]}

    starting = {"ready": False, "message": "starting", "failing": False}
    building = {"ready": False, "message": "building its environment env-1: installing", "failing": False}
    failing = {"ready": False, "message": "gunicorn exited with status 3; restarting", "failing": True}
    ready = {"ready": True, "message": "", "failing": False}

    assert realtime_status(api(starting)) == "starting"
    assert realtime_status(api(building)) == "starting"
    assert realtime_status(api(failing)) == "error"
    assert realtime_status(api(ready, failing)) == "live (with errors)"
    assert realtime_status(api(ready)) == "live"


def test_with_a_host_certificate_gunicorn_serves_tls_only_on_its_tcp_port(tmp_path: Path):
    argv = gunicorn_argv(_config().predictor, "0.0.0.0:9000", tls=HostTls("/c.pem", "/k.pem"))
    assert _option(argv, "--certfile") == "/c.pem" and _option(argv, "--keyfile") == "/k.pem"
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("c")
    key.write_text("k")
    assert host_tls({}) is None
    given = {"SLUICE_HOST_TLS_CERT": str(cert), "SLUICE_HOST_TLS_KEY": str(key)}
    assert host_tls(given) == HostTls(str(cert), str(key))
    with pytest.raises(ConfigError, match="go together"):
        host_tls({"SLUICE_HOST_TLS_CERT": str(cert)})
    with pytest.raises(ConfigError, match="is not a file"):
        host_tls({**given, "SLUICE_HOST_TLS_KEY": str(tmp_path / "none")})
