"""An AsyncAPI submission is answered in front of Flask (`api/async_front.py`), exactly as Flask's route
would answer it, and every request that layer does not take reaches Flask untouched.

Fast: the management app on in-memory services (registry, request store, kombu's in-memory broker);
a Flask `before_request` hook records which requests Flask saw.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from flask import Response, request
from flask.testing import FlaskClient

from api import context
from api.app import create_app
from foundation import figure_sink
from foundation.figures import Recorder
from foundation.idempotency import derived_id
from foundation.memory import (
    MemoryAcknowledgements,
    MemoryApiRegistry,
    MemoryFigureStore,
    MemoryIdempotencyKeys,
    MemoryLogStreams,
    MemoryPredictorBuilds,
    MemoryReplicaDirectory,
)
from foundation.settings import Settings
from jobs.asyncapi.memory import MemoryAsyncRequests
from jobs.asyncapi.request import PayloadKind, RequestStatus
from jobs.nodes.memory import MemoryNodes, MemoryWorkerHosts
from jobs.placement.batch import Placement
from jobs.services import Services
from jobs.store.memory import MemoryJobStore
from jobs.transport.memory import MemoryJobQueues
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig

KEY = "k-0123456789abcdef0123456789abcdef"


@dataclass
class Management:
    client: FlaskClient
    registry: MemoryApiRegistry
    requests: MemoryAsyncRequests
    flask_saw: list[str]  # "METHOD /path" of each request that reached Flask
    counted: Counter[tuple[str, tuple[str, ...]]]  # the process's figures counted meanwhile


class Counts(Counter[tuple[str, tuple[str, ...]]]):
    """A figure sink that keeps the counts."""

    def count(self, name: str, labels: tuple[str, ...], amount: int = 1) -> None:
        self[(name, labels)] += amount

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        pass


def management(tmp_path: Path, **settings: Any) -> Iterator[Management]:
    config = Settings(storage=str(tmp_path / "storage"), cache_dir=str(tmp_path / "cache"), max_body_bytes=1024,
                      **settings)
    celery = Celery("sluice-test", broker="memory://", set_as_current=False)
    celery.conf.update(task_serializer="json", accept_content=["json"])
    registry = MemoryApiRegistry()
    requests = MemoryAsyncRequests(registered=lambda name: any(a.name == name for a in registry.all()),
                                   generation=registry.generation)
    store, queues = MemoryJobStore(), MemoryJobQueues()
    nodes = MemoryNodes(config.node_ttl_s, inflight=store.inflight)
    services = Services(
        settings=config, celery=celery, redis=redis.Redis(), store=store, nodes=nodes,  # a client never used
        placement=Placement(queues, store, nodes), queues=queues, bundles=BundleStore(config.storage, tmp_path / "c"),
        requests=requests, worker_host_store=MemoryWorkerHosts(),
        acks=MemoryAcknowledgements(), idempotency_keys=MemoryIdempotencyKeys(),
    )
    for api in ({"name": "echo", "kind": "AsyncAPI", "predictor": {"path": "p.py"}},
                {"name": "iris", "kind": "BatchAPI", "predictor": {"path": "p.py"}}):
        registry.put(ApiConfig.from_dict(api), "sha256-abc")
    figures = MemoryFigureStore()
    app = create_app(services=services, recorder=Recorder(figures))
    app.extensions.update({context.REGISTRY: registry, context.PREDICTOR_BUILDS: MemoryPredictorBuilds(),
                           context.REPLICAS: MemoryReplicaDirectory(),
                           context.LOG_STREAMS: MemoryLogStreams(), context.FIGURE_STORE: figures})
    saw: list[str] = []

    @app.after_request  # also after a before-request hook's refusal and an error handler's answer
    def _saw(response: Response) -> Response:
        saw.append(f"{request.method} {request.path}")
        return response

    counts = Counts()
    figure_sink.install(counts)
    with app.test_client() as client:
        yield Management(client, registry, requests, saw, counts)
    figure_sink.install(None)
    app.extensions["sluice.figures"].close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Management]:
    yield from management(tmp_path)


def test_a_submission_is_stored_and_answered_without_reaching_flask(api: Management) -> None:
    answer = api.client.post("/echo", data=b'{"x": [1, 2]}', content_type="application/json")

    assert answer.status_code == 200 and answer.content_type == "application/json"
    request_id = answer.get_json()["id"]
    assert answer.headers["X-Request-ID"] == request_id
    stored = api.requests.get("echo", request_id)
    assert stored is not None and (stored.status, stored.kind, stored.payload) == (
        RequestStatus.IN_QUEUE, PayloadKind.JSON, b'{"x": [1, 2]}')
    assert api.flask_saw == []
    assert api.counted == {("sluice_http_responses_total", ("2xx",)): 1}


def test_the_clients_request_id_and_content_type_are_the_requests(api: Management) -> None:
    answer = api.client.post("/echo", data="héllo", content_type="text/plain; charset=utf-8",
                             headers={"X-Request-ID": "mine-1"})
    assert answer.get_json() == {"id": "mine-1"}
    assert api.requests.get("echo", "mine-1").kind is PayloadKind.TEXT  # type: ignore[union-attr]
    assert api.client.post("/echo", data=b"\x00\x01").status_code == 200  # no type: bytes


def test_a_body_its_type_cannot_read_is_a_400_and_nothing_is_stored(api: Management) -> None:
    answer = api.client.post("/echo", data=b"{not json", content_type="application/json",
                             headers={"X-Request-ID": "bad-1"})
    assert answer.status_code == 400 and answer.get_json()["kind"] == "bad_request"
    assert "not valid json" in answer.get_json()["message"]
    assert api.requests.get("echo", "bad-1") is None and api.flask_saw == []


def test_a_body_shorter_than_its_length_is_a_400_and_nothing_is_stored(api: Management) -> None:
    answer = api.client.post("/echo", input_stream=io.BytesIO(b'{"n": 1}'), content_type="application/json",
                             headers={"X-Request-ID": "cut-1"}, environ_overrides={"CONTENT_LENGTH": "100"})
    assert answer.status_code == 400
    assert answer.get_json() == {"kind": "bad_request", "message": "the body ended after 8 of its 100 bytes"}
    assert api.requests.get("echo", "cut-1") is None


def test_an_api_deleted_since_it_was_routed_is_a_404(api: Management) -> None:
    assert api.client.post("/echo", json={"n": 1}).status_code == 200  # routed, and the route kept
    api.registry.delete("echo")  # by another process: this one's kept route still says AsyncAPI
    answer = api.client.post("/echo", json={"n": 2})
    assert answer.status_code == 404 and answer.get_json()["kind"] == "api_not_found"


def test_a_kept_route_costs_no_read_of_the_registry(api: Management, monkeypatch: pytest.MonkeyPatch) -> None:
    assert api.client.post("/echo", json={"n": 0}).status_code == 200  # the route read and kept
    reads: list[str] = []
    for method in ("generation", "get"):
        real = getattr(api.registry, method)
        monkeypatch.setattr(api.registry, method, lambda *a, _real=real, _name=method: reads.append(_name) or _real(*a))
    for n in range(3):
        assert api.client.post("/echo", json={"n": n}).status_code == 200
    assert reads == [] and api.flask_saw == []


def test_a_submission_after_a_redeploy_follows_the_new_route_and_the_next_is_answered_here(api: Management) -> None:
    assert api.client.post("/echo", json={"n": 1}).status_code == 200  # routed as a plain AsyncAPI, kept
    # Another process redeploys it with server_side_batching: this one's kept route is a generation behind.
    api.registry.put(ApiConfig.from_dict({"name": "echo", "kind": "AsyncAPI", "predictor": {
        "path": "p.py", "server_side_batching": {"max_batch_size": 4, "batch_interval": 0.1}}}), "sha256-def")
    answer = api.client.post("/echo", json={"n": 2}, headers={"X-Request-ID": "after-1"})
    assert answer.status_code == 200 and answer.get_json() == {"id": "after-1"}
    assert api.flask_saw == ["POST /echo"]  # the script refused the old route; Flask read the new one
    assert [i for i, _ in api.requests.claim("echo", "node-1", 4, time.time())] == ["after-1"]  # queued for batches
    answer = api.client.post("/echo", json={"n": 3}, headers={"X-Request-ID": "after-2"})
    assert answer.get_json() == {"id": "after-2"} and api.flask_saw == ["POST /echo"]  # the new route, kept here


def test_an_api_redeployed_as_another_kind_is_that_kinds(api: Management) -> None:
    assert api.client.post("/echo", json={"n": 1}).status_code == 200
    api.registry.put(ApiConfig.from_dict({"name": "echo", "kind": "BatchAPI", "predictor": {"path": "p.py"}}), "s")
    answer = api.client.post("/echo", json={"n": 2}, headers={"X-Request-ID": "kind-1"})
    assert answer.status_code == 400  # a BatchAPI's job submission, refused by Flask's route
    assert api.requests.get("echo", "kind-1") is None and api.flask_saw == ["POST /echo"]


def test_a_failure_of_the_store_is_a_500_and_the_next_submission_is_served(
        api: Management, monkeypatch: pytest.MonkeyPatch) -> None:
    real_submit = api.requests.submit
    monkeypatch.setattr(api.requests, "submit", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("disk gone")))
    answer = api.client.post("/echo", json={"n": 1})
    assert answer.status_code == 500
    assert answer.get_json() == {"kind": "unexpected_error", "message": "RuntimeError: disk gone"}
    monkeypatch.setattr(api.requests, "submit", real_submit)
    assert api.client.post("/echo", json={"n": 2}).status_code == 200


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/echo", 405),            # an AsyncAPI answers POST only at /<name>
    ("POST", "/iris", 400),           # a BatchAPI's job submission (an empty body)
    ("POST", "/unknown", 404),
    ("POST", "/echo/", 404),
    ("POST", "/apis", 400),
])
def test_what_is_not_an_async_submission_is_flasks(api: Management, method: str, path: str, status: int) -> None:
    answer = api.client.open(path, method=method, data=b"", content_type="application/json")
    assert answer.status_code == status
    assert api.flask_saw == [f"{method} {path}"]


def test_a_body_over_the_limit_is_flasks_413(api: Management) -> None:
    answer = api.client.post("/echo", data=b"x" * 2048, content_type="application/octet-stream")
    assert answer.status_code == 413 and answer.get_json()["kind"] == "payload_too_large"
    assert api.flask_saw == ["POST /echo"]


def test_a_chunked_body_is_submitted_by_flasks_route(api: Management) -> None:
    # As gunicorn hands a chunked body over: no length, a stream that ends where the body does.
    answer = api.client.post("/echo", input_stream=io.BytesIO(b'{"n": 3}'), content_type="application/json",
                             headers={"Transfer-Encoding": "chunked", "X-Request-ID": "chunked-1"},
                             environ_base={"wsgi.input_terminated": True})
    assert answer.status_code == 200 and answer.get_json() == {"id": "chunked-1"}
    assert api.requests.get("echo", "chunked-1").payload == b'{"n": 3}'  # type: ignore[union-attr]
    assert api.flask_saw == ["POST /echo"]


def test_with_keys_a_valid_key_is_answered_here_and_a_missing_one_by_flasks_401(tmp_path: Path) -> None:
    api = next(management(tmp_path, api_keys=(KEY,)))
    refused = api.client.post("/echo", json={"n": 1})
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    wrong = api.client.post("/echo", json={"n": 1}, headers={"Authorization": "Bearer k-wrong"})
    assert wrong.status_code == 401
    assert api.flask_saw == ["POST /echo", "POST /echo"]
    answer = api.client.post("/echo", json={"n": 1}, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 200 and api.flask_saw == ["POST /echo", "POST /echo"]


class PublicSocket:
    """A connection gunicorn accepted on a public address."""

    def getsockname(self) -> tuple[str, int]:
        return ("10.0.0.5", 8000)


def test_without_keys_a_request_that_arrived_on_a_public_address_is_flasks_403(api: Management) -> None:
    answer = api.client.post("/echo", json={"n": 1}, environ_base={"gunicorn.socket": PublicSocket()})
    assert answer.status_code == 403 and answer.get_json()["kind"] == "insecure_bind"
    assert api.flask_saw == ["POST /echo"]


def test_the_answer_is_the_openapi_documents_async_submitted(api: Management) -> None:
    answer = api.client.post("/echo", json={"n": 1})
    assert set(json.loads(answer.data)) == {"id"}


def test_the_same_idempotency_key_gives_the_same_request_and_an_unconfirmed_one_is_a_503_to_retry(
        api: Management) -> None:
    services: Services = api.client.application.extensions[context.SERVICES]
    first = api.client.post("/echo", data=b'{"n": 1}', content_type="application/json",
                            headers={"Idempotency-Key": "k-1"})
    again = api.client.post("/echo", data=b'{"n": 1}', content_type="application/json",
                            headers={"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 200 and api.flask_saw == []
    assert first.get_json()["id"] == again.get_json()["id"] == derived_id("k-1")

    services.acks = MemoryAcknowledgements(replicas=1, confirmed_by=0)  # the replica is cut off
    refused = api.client.post("/echo", data=b'{"n": 2}', content_type="application/json",
                              headers={"Idempotency-Key": "k-2"})
    assert refused.status_code == 503 and refused.get_json()["kind"] == "not_acknowledged"
    assert (refused.headers["Idempotency-Key"], refused.headers["Retry-After"]) == ("k-2", "1")
    assert api.requests.get("echo", derived_id("k-2")) is not None  # the primary took it, unconfirmed
    services.acks = MemoryAcknowledgements()
    retried = api.client.post("/echo", data=b'{"n": 2}', content_type="application/json",
                              headers={"Idempotency-Key": "k-2"})
    assert retried.status_code == 200 and retried.get_json()["id"] == derived_id("k-2")
    assert api.client.post("/echo", data=b"{}", headers={"Idempotency-Key": "no spaces please"}).status_code == 400
