"""A realtime API behind a real haproxy, protected by API keys because the operator said so
(`SLUICE_PROTECT_REALTIME=1`): a caller without the key never reaches a replica.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from foundation.api_registry import RedisApiRegistry
from foundation.settings import Settings
from predictors_runtime.config import ApiConfig
from sluice.embedded import free_port
from sluice.proxy import ProxyController
from tests.integration.test_proxy import Backend, Launchers, RunningProxy, tagged, wait_for

pytestmark = pytest.mark.integration

KEY = "k-6d0e2b9a51f34c88"


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Backend]]:
    folder = tmp_path_factory.mktemp("proxy-auth-backends")
    started = {name: Backend(name, folder) for name in ("r1", "management")}
    try:
        for backend in started.values():
            wait_for(lambda backend=backend: backend.ready() or backend.process.poll() is not None, 60,
                     f"gunicorn {backend.name}")
            assert backend.process.poll() is None, (folder / f"{backend.name}.log").read_text()
        yield started
    finally:
        for backend in started.values():
            backend.stop()


@pytest.fixture
def protected_proxy(redis_client: redis.Redis, backends: dict[str, Backend], tmp_path: Path) -> Iterator[RunningProxy]:
    settings = Settings.from_env({"SLUICE_API_KEYS": KEY, "SLUICE_PROTECT_REALTIME": "1"})
    controller = ProxyController(redis_client, port=free_port(), management=backends["management"].address,
                                 state_dir=tmp_path / "proxy", settings=settings)
    running = RunningProxy(controller).start()
    try:
        yield running
    finally:
        running.stop()


def test_a_protected_realtime_api_answers_401_without_the_key_and_serves_with_it(
        protected_proxy, redis_client, backends):
    RedisApiRegistry(redis_client).put(ApiConfig.from_dict(
        {"name": "ap", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"}}), "b1")
    launchers = Launchers(redis_client)
    try:
        launchers.add("ap-1", "ap", backends["r1"])
        protected_proxy.settle_on("ap-1")
        url = f"{protected_proxy.url}/ap"

        refused_tag = uuid.uuid4().hex
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
            answer = requests.post(url, params={"tag": refused_tag}, json={"n": 1}, headers=headers, timeout=10)
            assert answer.status_code == 401, headers
            assert answer.json()["kind"] == "unauthorized"
            assert answer.headers["WWW-Authenticate"] == "Bearer"
            assert answer.headers["X-Request-ID"]

        for authorization in (f"Bearer {KEY}", f"bearer {KEY}"):
            answer = requests.post(url, json={"n": 1}, headers={"Authorization": authorization}, timeout=10)
            assert answer.status_code == 200, answer.text
            assert answer.json()["server"] == "r1"
        assert tagged(backends["r1"], refused_tag) == []  # refused at the proxy, never run
    finally:
        launchers.close()


def test_a_protected_grpc_api_refuses_a_call_without_the_key_and_says_not_ready_in_grpc_terms(
        protected_proxy, redis_client, redis_server, tmp_path):
    """The proxy's own answers to a gRPC caller are gRPC answers: UNAUTHENTICATED, UNAVAILABLE."""
    import grpc

    from tests.integration.test_grpc_replica import IRIS_HANDLER, IRIS_PROTO, GrpcReplica, stubs_of

    project = tmp_path / "project"
    project.mkdir()
    (project / "iris_classifier.proto").write_text(IRIS_PROTO)
    (project / "handler.py").write_text(IRIS_HANDLER)
    spec = {"name": "iris-classifier", "kind": "RealtimeAPI", "predictor": {
        "path": "handler.py", "protobuf_path": "iris_classifier.proto",
        "config": {"labels": ["setosa", "versicolor", "virginica"]}}}
    RedisApiRegistry(redis_client).put(ApiConfig.from_dict(spec), "b1")
    replica = GrpcReplica(tmp_path, project, spec, redis_server)
    messages, stubs = stubs_of(project / "iris_classifier.proto", tmp_path / "client")
    launchers = Launchers(redis_client)
    channel = grpc.insecure_channel(protected_proxy.url.split("://", 1)[1])
    try:
        launchers.add("iris-1", "iris-classifier", f"127.0.0.1:{replica.port}")
        protected_proxy.settle_on("iris-1")
        stub = stubs.HandlerStub(channel)
        sample = messages.Sample(petal_length=1.4)

        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(sample, metadata=(("authorization", "Bearer wrong"),), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "this API needs an API key: send Authorization: Bearer KEY"

        keyed = (("authorization", f"Bearer {KEY}"),)
        wait_for(lambda: _answers(stub, sample, keyed), 60, "the replica to build its predictor")
        assert stub.Predict(sample, metadata=keyed, timeout=30).classification == "setosa"

        protected_proxy.controller.haproxy.command("@1 disable server rt_iris-classifier/iris-1")
        with pytest.raises(grpc.RpcError) as unavailable:
            stub.Predict(sample, metadata=keyed, timeout=30)
        assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
        assert unavailable.value.details() == "no replica of iris-classifier is ready"
    finally:
        channel.close()
        launchers.close()
        replica.stop()


def _answers(stub, sample, metadata) -> bool:
    import grpc

    try:
        stub.Predict(sample, metadata=metadata, timeout=30)
        return True
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return False
