"""TLS at the public address: `sluice up --tls-cert/--tls-key` serves https only, a client that
trusts the CA deploys, runs a job and calls a realtime API, one that does not is told why, and a
certificate renewed on disk is served without a restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import redis
import requests
import yaml
from cryptography import x509

from foundation.replica_directory import RedisReplicaDirectory
from sluice.client import UntrustedCertificate
from sluice.embedded import Stack, free_port
from sluice.tls.self_signed import make_self_signed
from tests.integration.conftest import ROOM, closing_client, write_project
from tests.integration.processes import children_of
from tests.integration.test_grpc_replica import IRIS_HANDLER, IRIS_PROTO, stubs_of
from tests.integration.test_realtime import write_realtime_project

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _served_certificate(port: int, ca: Path) -> x509.Certificate:
    """The certificate the public port presents now, checked against `ca` (a new connection)."""
    context = ssl.create_default_context(cafile=str(ca))
    with (socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
          context.wrap_socket(raw, server_hostname="127.0.0.1") as tls):
        der = tls.getpeercert(binary_form=True)
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _plaintext_answer(port: int) -> bytes:
    """What the public port sends back to a plaintext HTTP request (before it closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        while chunk := plain.recv(4096):
            received += chunk
    return received


def _cli(url: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.cli", "--url", url, *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT, env=env)


def test_sluice_up_with_a_certificate_serves_https_only_and_swaps_the_certificate_without_a_restart(tmp_path,
                                                                                                       monkeypatch):
    pair = make_self_signed(tmp_path / "tls", ["localhost", "127.0.0.1"])
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_REDIS_URL", "SLUICE_CA_BUNDLE")}
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "up", "--port", str(port), "--data-dir", str(tmp_path / "home"),
         "--tls-cert", str(pair.cert), "--tls-key", str(pair.key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    try:
        url = process.stdout.readline().strip()
        assert url == f"https://127.0.0.1:{port}", url or process.stderr.read()
        trusted = {**env, "SLUICE_CA_BUNDLE": str(pair.ca)}

        # The CLI, trusting the CA, deploys a batch API and runs a job to the end.
        batch = write_project(tmp_path / "batch", "tls-batch", {"events": str(tmp_path / "events.jsonl")})
        assert _cli(url, trusted, "deploy", str(batch)).returncode == 0
        items = tmp_path / "items.json"
        items.write_text(json.dumps([1, 2, 3, 4]))
        ran = _cli(url, trusted, "submit", "tls-batch", "--items", str(items), "--batch-size", "2", "--wait",
                   "-o", "json")
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["status"] == "status_succeeded"

        # A realtime API over https; the endpoint it is given is an https:// address.
        realtime = write_realtime_project(tmp_path / "greeter", "tls-greeter")
        assert _cli(url, trusted, "deploy", str(realtime)).returncode == 0
        client = closing_client(url, ca_bundle=str(pair.ca))
        client.wait_ready("tls-greeter", timeout=120)
        assert client.predict("tls-greeter", {"hello": "tls"})["echo"] == {"hello": "tls"}
        assert client.get_api("tls-greeter")["endpoint"] == f"{url}/tls-greeter"

        # Plaintext gets no answer: the handshake fails and nothing HTTP comes back.
        assert b"HTTP/" not in _plaintext_answer(port)
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10)

        # A client without the CA is refused, and told what to give it.
        untrusted = _cli(url, env, "get")
        assert untrusted.returncode != 0
        assert "does not trust" in untrusted.stderr and "--ca-bundle" in untrusted.stderr, untrusted.stderr
        monkeypatch.delenv("SLUICE_CA_BUNDLE", raising=False)
        with pytest.raises(UntrustedCertificate, match="does not trust .*SLUICE_CA_BUNDLE"):
            closing_client(url).apis()

        # A renewed certificate (same CA, one more name) written over the old files is served from the
        # next connection on, by the same proxy process, while requests keep being answered.
        before = _served_certificate(port, pair.ca)
        proxies = [pid for pid in children_of(process.pid)
                   if "proxy" in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")]
        renewed = make_self_signed(tmp_path / "tls", ["localhost", "127.0.0.1", "sluice.test"])
        assert renewed.cert == pair.cert
        deadline = time.monotonic() + 30
        while _served_certificate(port, pair.ca).serial_number == before.serial_number:
            assert client.predict("tls-greeter", {"during": "swap"})["echo"] == {"during": "swap"}
            assert time.monotonic() < deadline, "the renewed certificate was not served within 30 s"
            time.sleep(0.2)
        served = _served_certificate(port, pair.ca)
        names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "sluice.test" in names.get_values_for_type(x509.DNSName)
        assert proxies and all(pid in children_of(process.pid) for pid in proxies)
        assert client.predict("tls-greeter", {"after": "swap"})["echo"] == {"after": "swap"}
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0, process.stderr.read()


def test_sluice_up_tls_self_signed_prints_its_ca_and_keeps_it_across_restarts(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SLUICE_REDIS_URL", "SLUICE_CA_BUNDLE")}
    home, port = tmp_path / "home", free_port()
    cas = []
    for _ in range(2):
        process = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "up", "--port", str(port), "--data-dir", str(home),
             "--tls", "self-signed"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )
        try:
            url = process.stdout.readline().strip()
            assert url == f"https://127.0.0.1:{port}", url or process.stderr.read()
            listed = _cli(url, {**env, "SLUICE_CA_BUNDLE": str(home / "tls" / "ca.pem")}, "get", "-o", "json")
            assert listed.returncode == 0, listed.stderr
            served = _served_certificate(port, home / "tls" / "ca.pem")
            cas.append((home / "tls" / "ca.pem").read_bytes())
        finally:
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=90) == 0
        banner = process.stderr.read()
        assert f"SLUICE_CA_BUNDLE={home / 'tls' / 'ca.pem'}" in banner, banner
        names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "localhost" in names.get_values_for_type(x509.DNSName)
    # The same CA both times: a client handed it once keeps trusting this stack.
    assert cas[0] == cas[1]
    assert oct((home / "tls" / "ca-key.pem").stat().st_mode & 0o777) == "0o600"


def test_a_host_with_a_certificate_serves_its_replicas_over_tls_only_and_the_proxy_checks_it(tmp_path):
    pair = make_self_signed(tmp_path / "hosts", ["127.0.0.1", "localhost"])
    env = {"SLUICE_HOST_TLS_CERT": str(pair.cert), "SLUICE_HOST_TLS_KEY": str(pair.key),
           "SLUICE_HOST_TLS_CA": str(pair.ca)}
    with Stack(port=free_port(), workers=0, offers=ROOM, data_dir=tmp_path / "stack", env=env,
               worker_host=False) as stack:
        client = closing_client(stack.url)
        client.deploy(write_realtime_project(tmp_path / "greeter", "host-tls"))
        client.wait_ready("host-tls", timeout=120)
        assert client.predict("host-tls", {"over": "tls"})["echo"] == {"over": "tls"}  # proxy -> replica over TLS
        [record] = [r for r in RedisReplicaDirectory(redis.Redis.from_url(stack.redis_url or "")).all()
                    if r.api == "host-tls"]
        assert record.tls and record.socket == ""  # TLS only: no plain Unix socket beside it
        replica = f"{record.host}:{record.port}/host-tls"
        with pytest.raises(requests.ConnectionError):
            requests.post(f"http://{replica}", json={"plain": True}, timeout=10)
        answered = requests.post(f"https://{replica}", json={"direct": True}, timeout=10, verify=str(pair.ca))
        assert answered.status_code == 200 and answered.json()["echo"] == {"direct": True}

        # A gRPC API of the same host: its replica serves TLS only too, and the proxy calls it over TLS.
        project = tmp_path / "grpc"
        project.mkdir()
        (project / "iris_classifier.proto").write_text(IRIS_PROTO)
        (project / "handler.py").write_text(IRIS_HANDLER)
        (project / "cortex.yaml").write_text(yaml.safe_dump([{"name": "iris-classifier", "kind": "RealtimeAPI",
                                                              "handler": {"type": "python", "path": "handler.py",
                                                                          "protobuf_path": "iris_classifier.proto",
                                                                          "config": {"labels": ["a", "b", "c"]}}}]))
        messages, stubs = stubs_of(project / "iris_classifier.proto", tmp_path / "stubs")
        client.deploy(project / "cortex.yaml")
        client.wait_ready("iris-classifier", timeout=120)
        sample = messages.Sample(sepal_length=5.2, sepal_width=3.6, petal_length=1.4, petal_width=0.3)
        with grpc.insecure_channel(stack.url.split("://", 1)[1]) as channel:  # the public port here is plain
            assert stubs.HandlerStub(channel).Predict(sample, timeout=30).classification == "a"
        [served] = [r for r in RedisReplicaDirectory(redis.Redis.from_url(stack.redis_url or "")).all()
                    if r.api == "iris-classifier"]
        assert served.tls and served.socket == ""
        with grpc.insecure_channel(f"{served.host}:{served.port}") as plain, pytest.raises(grpc.RpcError):
            stubs.HandlerStub(plain).Predict(sample, timeout=10)
