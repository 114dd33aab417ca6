"""Redis over TLS: a `rediss://` Redis (and Redis Sentinel with `SLUICE_REDIS_TLS=1`) is reached
through Sluice's own transport, with its receipts and scripts, every connection checking the
server's certificate against `SLUICE_REDIS_CA`; a job runs end to end, and through a failover of
a TLS-only Sentinel deployment."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.connection import SSLConnection

from foundation.errors import ConfigError
from foundation.redis_clients import HEARTBEAT, client
from foundation.settings import Settings
from jobs.celery_app import create_celery
from jobs.transport.broker import SentinelTransport, Transport
from sluice.embedded import Stack, free_port
from sluice.tls.self_signed import SelfSigned, make_self_signed
from testbed.sentinel_cluster import SentinelCluster
from testbed.waiting import wait_for

from .conftest import FAST_LOOPS, ROOM, closing_client, read_events, write_project

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> SelfSigned:
    return make_self_signed(tmp_path_factory.mktemp("redis-tls"), ["127.0.0.1", "localhost"])


@pytest.fixture(scope="module")
def tls_redis(certificate: SelfSigned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A redis-server listening only on a TLS port; its port."""
    port, folder = free_port(), tmp_path_factory.mktemp("redis-tls-data")
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--tls-cert-file", str(certificate.cert), "--tls-key-file", str(certificate.key),
         "--tls-ca-cert-file", str(certificate.ca), "--tls-auth-clients", "no", "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    trusted = redis.Redis(port=port, ssl=True, ssl_ca_certs=str(certificate.ca), socket_timeout=1)
    wait_for(lambda: _pings(trusted), 15, "the TLS redis-server")
    yield port
    process.terminate()
    process.wait(timeout=10)


def _pings(candidate: redis.Redis) -> bool:
    try:
        return bool(candidate.ping())
    except redis.RedisError:
        return False


def test_a_rediss_url_goes_through_sluices_own_transport_over_tls_checking_the_certificate(
    tls_redis: int, certificate: SelfSigned, tmp_path: Path,
) -> None:
    env = {"SLUICE_REDIS_URL": f"rediss://127.0.0.1:{tls_redis}/0", "SLUICE_REDIS_CA": str(certificate.ca)}
    settings = Settings.from_env(env)
    app = create_celery(settings)
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)  # Sluice's, with its receipts, not kombu's
        channel = connection.default_channel
        assert issubclass(channel.client.connection_pool.connection_class, SSLConnection)
        channel.client.lpush("sluice-tls-probe", "x")
        assert channel.client.rpop("sluice-tls-probe") == b"x"
    assert client(settings.redis_address, HEARTBEAT).ping()
    # Without the CA the server's certificate is refused; plaintext to the TLS port gets nowhere.
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        client(Settings.from_env({"SLUICE_REDIS_URL": env["SLUICE_REDIS_URL"]}).redis_address, HEARTBEAT).ping()
    assert not _pings(redis.Redis(port=tls_redis, socket_timeout=1))
    with pytest.raises(ConfigError, match="SLUICE_REDIS_CA: .* is not a file"):
        Settings.from_env({**env, "SLUICE_REDIS_CA": str(tmp_path / "none.pem")})
    with pytest.raises(ConfigError, match="not reached over TLS"):
        Settings.from_env({"SLUICE_REDIS_URL": "redis://127.0.0.1:6379/0", "SLUICE_REDIS_CA": str(certificate.ca)})

    # A whole stack on it: a job runs to its end through the TLS broker and store.
    with Stack(port=free_port(), offers=ROOM, workers=1, redis_url=env["SLUICE_REDIS_URL"],
               data_dir=tmp_path / "stack", env={**FAST_LOOPS, **env}, proxy=False, realtime=False) as stack:
        api = write_project(tmp_path / "tls-job", "tls-job", {"events": str(tmp_path / "events.jsonl")})
        job_client = closing_client(stack.url)
        job_client.deploy(api)
        spec = job_client.submit("tls-job", list(range(6)), batch_size=2)
        done = wait_for(lambda: _ended(job_client, spec["job_id"]), 120, "the job over TLS")
        assert done == "status_succeeded"
        assert sum(event["event"] == "complete" for event in read_events(tmp_path / "events.jsonl")) == 1


def _ended(job_client, job_id: str) -> str | None:
    status = str(job_client.job("tls-job", job_id)["status"])
    return None if status in ("status_enqueuing", "status_running") else status


@pytest.mark.slow
def test_a_job_runs_through_a_failover_of_a_tls_only_sentinel_deployment(
    certificate: SelfSigned, tmp_path: Path,
) -> None:
    cluster = SentinelCluster(tmp_path / "cluster", tls=certificate).start()
    try:
        settings = Settings.from_env(cluster.env())
        with create_celery(settings).connection_for_write() as connection:
            assert isinstance(connection.transport, SentinelTransport)
        with Stack(port=free_port(), offers=ROOM, workers=1, data_dir=tmp_path / "stack",
                   env={**FAST_LOOPS, **cluster.env()}, proxy=False, realtime=False) as stack:
            api = write_project(tmp_path / "tls-ha", "tls-ha", {"events": str(tmp_path / "events.jsonl"),
                                                                  "sleep": 0.05})
            job_client = closing_client(stack.url, timeout=60)
            job_client.deploy(api)
            spec = job_client.submit("tls-ha", list(range(60)), batch_size=1)
            wait_for(lambda: len(read_events(tmp_path / "events.jsonl")) >= 10, 60, "the job under way")
            old = cluster.kill_primary()
            killed = time.monotonic()
            cluster.wait_failover(old)
            print(f"\nTLS-only sentinels promoted the replica {time.monotonic() - killed:.1f} s after the kill")

            def ended() -> str | None:
                try:
                    status = str(job_client.job("tls-ha", spec["job_id"])["status"])
                except Exception:  # noqa: BLE001 - the API's own calls ride the failover out
                    return None
                return None if status in ("status_enqueuing", "status_running") else status

            assert wait_for(ended, 120, "the job through the failover") == "status_succeeded"
        done = {item for event in read_events(tmp_path / "events.jsonl") if event["event"] == "predict"
                for item in event["items"]}
        assert done == set(range(60))
    finally:
        cluster.close()
