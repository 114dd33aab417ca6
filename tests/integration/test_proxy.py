"""The public entry point against a real haproxy: routing, per-replica limits, timeouts, reloads.

Replicas and the management API are real gunicorn processes serving `proxy_backends.py`, which
answers with who served the request and what the proxy told it; replica records live in a real
redis-server, kept fresh by a heartbeat thread as launchers would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from foundation.api_registry import RedisApiRegistry
from foundation.figure_store import RedisFigureStore
from foundation.figures import SPLIT_REQUESTS, read_figures
from foundation.keys import PROXIES as PROXIES_KEY
from foundation.proxy_load import RedisProxyLoadBook
from foundation.proxy_registry import RedisProxyRegistry
from foundation.proxy_registry import unrouted as unrouted_by
from foundation.replica_directory import RedisReplicaDirectory, ReplicaRecord
from foundation.replica_scale import RedisScaleBook, ReplicaScale
from jobs.scaling.realtime import RealtimeScaling
from predictors_runtime.config import ApiConfig
from predictors_runtime.splitter_config import TrafficSplitterConfig
from sluice.embedded import free_port
from sluice.haproxy import DEFAULT_PRIORITY
from sluice.proxy import ProxyController
from testbed.waiting import wait_for

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
BACKENDS = ("r1", "r2", "r3", "management")


def unrouted(client, replica_id: str, now: float) -> bool:
    """What a draining launcher asks: does any live proxy still route this replica?"""
    return unrouted_by(RedisProxyRegistry(client).live(now), replica_id)



# -- the servers behind the proxy -------------------------------------------------------------------
class Backend:
    def __init__(self, name: str, log_dir: Path) -> None:
        self.name, self.port = name, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child's output until stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-k", "gthread", "--threads", "64", "-w", "1",
             "-b", self.address, "--chdir", str(HERE), "--timeout", "120", "proxy_backends:app"],
            env={**os.environ, "PROXY_BACKEND_NAME": name}, stdout=self.log, stderr=subprocess.STDOUT,
        )

    def seen(self) -> list[dict[str, Any]]:
        return requests.get(f"http://{self.address}/_seen", timeout=10).json()["seen"]

    def ready(self) -> bool:
        try:
            self.seen()
            return True
        except requests.RequestException:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Backend]]:
    folder = tmp_path_factory.mktemp("proxy-backends")
    started = {name: Backend(name, folder) for name in BACKENDS}
    try:
        for backend in started.values():
            wait_for(lambda backend=backend: backend.ready() or backend.process.poll() is not None, 60,
                     f"gunicorn {backend.name}")
            assert backend.process.poll() is None, (folder / f"{backend.name}.log").read_text()
        yield started
    finally:
        for backend in started.values():
            backend.stop()


class Launchers:
    """Announces replica records every half second, as the launchers on each host do."""

    def __init__(self, client: redis.Redis) -> None:
        self.directory = RedisReplicaDirectory(client)
        self.records: dict[str, ReplicaRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                for record in self.records.values():
                    self.directory.announce(record.seen_at(time.time()))

    def add(self, replica_id: str, api: str, at: Backend | str) -> None:
        host, port = (at.address if isinstance(at, Backend) else at).split(":")
        record = ReplicaRecord(replica_id=replica_id, api=api, bundle="b1", host=host, port=int(port),
                               processes=1, ready=True, draining=False, seen=time.time())
        with self._lock:
            self.records[replica_id] = record
            self.directory.announce(record)

    def drain(self, replica_id: str) -> None:
        with self._lock:
            self.records[replica_id] = replace(self.records[replica_id], draining=True, seen=time.time())
            self.directory.announce(self.records[replica_id])

    def remove(self, replica_id: str) -> None:
        with self._lock:
            self.records.pop(replica_id)
            self.directory.remove(replica_id)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def launchers(redis_client: redis.Redis) -> Iterator[Launchers]:
    beating = Launchers(redis_client)
    yield beating
    beating.close()


@pytest.fixture
def deploy(redis_client: redis.Redis) -> Callable[..., str]:
    registry = RedisApiRegistry(redis_client)

    def _deploy(name: str, kind: str = "RealtimeAPI", **predictor: Any) -> str:
        registry.put(ApiConfig.from_dict({"name": name, "kind": kind,
                                          "predictor": {"path": "predictor.py", **predictor}}), "b1")
        return name
    return _deploy


class RunningProxy:
    """A controller stepping in a thread, as `sluice proxy` runs it."""

    def __init__(self, controller: ProxyController) -> None:
        self.controller = controller
        self.url = controller.url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=controller.run, args=(self._stop,), daemon=True)

    def start(self) -> RunningProxy:
        self.controller.start()
        self._thread.start()
        return self

    def routes(self) -> set[str]:
        return {rid for route in self.controller.routes for rid in route.replica_ids}

    def settle_on(self, *replica_ids: str, timeout: float = 20) -> None:
        wait_for(lambda: self.routes() == set(replica_ids) and self.controller.settled, timeout,
                 f"the proxy to route exactly {sorted(replica_ids)}")

    def backend_row(self, api: str) -> dict[str, str]:
        return next(row for row in self.controller.haproxy.stats()
                    if row["pxname"] == f"rt_{api}" and row["svname"] == "BACKEND")

    def queued(self, api: str) -> int:
        return int(self.backend_row(api)["qcur"])

    def running(self, api: str) -> int:
        return sum(int(row["scur"] or 0) for row in self.controller.haproxy.stats()
                   if row["pxname"] == f"rt_{api}" and row["svname"] != "BACKEND")

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.controller.stop(grace=2)


@pytest.fixture
def proxy(redis_client: redis.Redis, backends: dict[str, Backend], tmp_path: Path) -> Iterator[RunningProxy]:
    controller = ProxyController(redis_client, port=free_port(), management=backends["management"].address,
                                 state_dir=tmp_path / "proxy")
    running = RunningProxy(controller).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    """A file slow requests wait for; opened (at the latest) when the test ends."""
    path = tmp_path / f"gate-{uuid.uuid4().hex}"
    yield path
    path.touch()


def tagged(backend: Backend, tag: str) -> list[dict[str, Any]]:
    return [r for r in backend.seen() if r["tag"] == tag]


# -- routing ---------------------------------------------------------------------------------------
def test_realtime_paths_go_to_their_replicas_and_everything_else_to_the_management_api(
        proxy, deploy, launchers, backends):
    deploy("ap")
    deploy("bp", kind="BatchAPI")
    deploy("cp")  # realtime, but no replica yet: the management API says why
    launchers.add("ap-1", "ap", backends["r1"])
    launchers.add("bp-1", "bp", backends["r2"])  # a BatchAPI is never routed to replicas
    proxy.settle_on("ap-1")

    for method, path in [("GET", "/ap"), ("POST", "/ap"), ("GET", "/ap/"), ("POST", "/ap?x=1")]:
        answer = requests.request(method, proxy.url + path, json={"n": 1}, timeout=10)
        assert answer.status_code == 200 and answer.json()["server"] == "r1", (method, path)
    for path in ["/apis", "/apis/ap", "/ap/more", "/apx", "/batch/ap", "/batch/bp", "/bp", "/cp", "/healthz",
                 "/metrics", "/openapi.json", "/no-such-api", "/"]:
        answer = requests.post(proxy.url + path, json={}, timeout=10)
        assert answer.json()["server"] == "management", path
        assert answer.json()["path"] == path


def test_haproxy_and_its_workers_run_ahead_of_the_replicas_when_allowed(proxy):
    """Its one thread forwards every request: it asks for nice -10 (root or CAP_SYS_NICE), else keeps
    the controller's priority (sluice/haproxy.py)."""
    master = proxy.controller.haproxy.process
    state = proxy.controller.haproxy.state()
    assert master is not None and state is not None and state.workers
    allowed = os.geteuid() == 0
    expected = DEFAULT_PRIORITY if allowed else os.getpriority(os.PRIO_PROCESS, 0)
    for pid in (master.pid, *state.workers):
        assert os.getpriority(os.PRIO_PROCESS, pid) == expected, pid


def test_a_busy_replica_gets_no_new_request_while_another_is_idle(proxy, deploy, launchers, backends, gate):
    deploy("ap", threads_per_process=4)
    launchers.add("ap-1", "ap", backends["r1"])
    launchers.add("ap-2", "ap", backends["r2"])
    proxy.settle_on("ap-1", "ap-2")
    tag = uuid.uuid4().hex
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(requests.get, f"{proxy.url}/ap", params={"gate": str(gate), "tag": tag}, timeout=60)
        wait_for(lambda: proxy.running("ap") == 1, 10, "the slow request to start")
        busy = "r1" if tagged(backends["r1"], tag) else "r2"
        answered = [requests.get(f"{proxy.url}/ap", timeout=10).json()["server"] for _ in range(4)]
        gate.touch()
        assert slow.result().json()["server"] == busy
    assert busy not in answered and len(set(answered)) == 1


def test_concurrent_requests_spread_over_both_replicas(proxy, deploy, launchers, backends):
    deploy("ap", threads_per_process=8)
    launchers.add("ap-1", "ap", backends["r1"])
    launchers.add("ap-2", "ap", backends["r2"])
    proxy.settle_on("ap-1", "ap-2")
    with ThreadPoolExecutor(8) as pool:
        servers = list(pool.map(lambda _: requests.get(f"{proxy.url}/ap?sleep=0.5", timeout=30).json()["server"],
                                range(8)))
    assert Counter(servers) == {"r1": 4, "r2": 4}


def test_a_realtime_backend_without_a_usable_server_answers_not_ready_at_once(proxy, deploy, launchers, backends):
    deploy("ap")
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    proxy.controller.haproxy.command("@1 disable server rt_ap/ap-1")
    answer = requests.get(f"{proxy.url}/ap", timeout=10)
    assert answer.status_code == 503
    assert answer.json() == {"kind": "not_ready", "message": "no replica of ap is ready",
                             "request_id": answer.headers["X-Request-ID"]}


def test_a_replica_that_refuses_connections_is_passed_over_and_alone_answers_not_ready(
        proxy, deploy, launchers, backends):
    deploy("ap")
    launchers.add("ap-dead", "ap", f"127.0.0.1:{free_port()}")  # nothing listens: a replica that just died
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-dead", "ap-1")
    assert [requests.get(f"{proxy.url}/ap", timeout=30).json()["server"] for _ in range(3)] == ["r1"] * 3
    launchers.remove("ap-1")
    proxy.settle_on("ap-dead")
    answer = requests.get(f"{proxy.url}/ap", timeout=30)
    assert answer.status_code == 503
    assert answer.json() == {"kind": "not_ready", "message": "no replica of ap could be reached",
                             "request_id": answer.headers["X-Request-ID"]}


# -- limits ----------------------------------------------------------------------------------------
def _get(url: str, **params: Any) -> tuple[requests.Response, float]:
    started = time.perf_counter()
    answer = requests.get(url, params=params, timeout=60)
    return answer, time.perf_counter() - started


def test_beyond_concurrency_and_queue_requests_are_refused_at_once(proxy, deploy, launchers, backends, gate):
    concurrency, queue_length, extra = 2, 3, 5
    deploy("ap", max_concurrency=concurrency, max_queue_length=queue_length)
    launchers.add("ap-1", "ap", backends["r1"])
    launchers.add("ap-2", "ap", backends["r2"])
    proxy.settle_on("ap-1", "ap-2")
    url, tag = f"{proxy.url}/ap", uuid.uuid4().hex
    with ThreadPoolExecutor(4 * (concurrency + queue_length)) as pool:
        running = [pool.submit(_get, url, gate=str(gate), tag=tag) for _ in range(2 * concurrency)]
        wait_for(lambda: proxy.running("ap") == 2 * concurrency, 10, "every replica to be busy")
        queued = [pool.submit(_get, url, gate=str(gate), tag=tag) for _ in range(2 * queue_length)]
        wait_for(lambda: proxy.queued("ap") == 2 * queue_length, 10, "the queue to fill")

        # Answered while every held request is still held (the gate is closed): refused at once,
        # neither queued behind them nor counted in the queue.
        refused = [_get(url, tag=tag) for _ in range(extra)]
        for answer, _ in refused:
            assert answer.status_code == 503, answer.text
            assert answer.json()["kind"] == "overloaded" and answer.headers["Retry-After"] == "1"
            assert answer.json()["request_id"] == answer.headers["X-Request-ID"]
        assert proxy.running("ap") == 2 * concurrency and proxy.queued("ap") == 2 * queue_length
        gate.touch()
        served = [future.result()[0] for future in running + queued]
    assert [answer.status_code for answer in served] == [200] * (2 * (concurrency + queue_length))
    # The refused ones never reached a replica.
    assert len(tagged(backends["r1"], tag)) + len(tagged(backends["r2"], tag)) == 2 * (concurrency + queue_length)


def test_without_a_queue_a_busy_replica_refuses_at_once(proxy, deploy, launchers, backends, gate):
    deploy("ap", max_concurrency=1, max_queue_length=0)
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(_get, f"{proxy.url}/ap", gate=str(gate))
        wait_for(lambda: proxy.running("ap") == 1, 10, "the replica to be busy")
        answer, _ = _get(f"{proxy.url}/ap")
        assert answer.status_code == 503 and answer.json()["kind"] == "overloaded"
        gate.touch()
        assert busy.result()[0].status_code == 200
    assert requests.get(f"{proxy.url}/ap", timeout=10).status_code == 200


def test_a_replica_holds_no_more_than_max_replica_concurrency_running_and_queued(
        proxy, redis_client, launchers, backends, gate):
    # Cortex's limit: one replica running 1 request may hold 3 in all; the 4th is refused at once.
    RedisApiRegistry(redis_client).put(ApiConfig.from_dict({
        "name": "ap", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"},
        "autoscaling": {"max_replica_concurrency": 3},
    }), "b1")
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    url, tag = f"{proxy.url}/ap", uuid.uuid4().hex
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(_get, url, gate=str(gate), tag=tag)
        wait_for(lambda: proxy.running("ap") == 1, 10, "the replica to be busy")
        queued = [pool.submit(_get, url, gate=str(gate), tag=tag) for _ in range(2)]
        wait_for(lambda: proxy.queued("ap") == 2, 10, "two requests to wait for it")

        refused, _ = _get(url, tag=tag)
        assert refused.status_code == 503, refused.text
        assert refused.json()["kind"] == "overloaded" and refused.headers["Retry-After"] == "1"
        gate.touch()
        served = [future.result()[0] for future in [running, *queued]]
    assert [answer.status_code for answer in served] == [200] * 3
    assert len(tagged(backends["r1"], tag)) == 3  # the refused one never reached the replica


def test_a_slow_replica_answers_504_past_the_request_timeout(proxy, deploy, launchers, backends):
    deploy("ap", request_timeout=1)
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    tag = uuid.uuid4().hex
    sent_ms = time.time() * 1000
    answer, elapsed = _get(f"{proxy.url}/ap", sleep=5, tag=tag)
    assert answer.status_code == 504
    assert answer.json() == {"kind": "request_timeout",
                             "message": "ap did not answer within its request_timeout of 1 s",
                             "request_id": answer.headers["X-Request-ID"]}
    assert elapsed < 5  # answered before the replica could have (it sleeps 5 s): the proxy did not wait
    # The replica was told when the answer is due: one request_timeout after the proxy got it.
    [seen] = tagged(backends["r1"], tag)
    assert sent_ms + 1000 - 100 <= int(seen["deadline_ms"]) <= time.time() * 1000


def test_a_request_that_waits_in_the_queue_past_the_request_timeout_gets_504(proxy, deploy, launchers, backends, gate):
    deploy("ap", max_concurrency=1, max_queue_length=5, request_timeout=1)
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    tag = uuid.uuid4().hex
    with ThreadPoolExecutor(2) as pool:
        # The replica is busy for the whole timeout, then with the next in line for another.
        busy = [pool.submit(_get, f"{proxy.url}/ap", gate=str(gate))]
        wait_for(lambda: proxy.running("ap") == 1, 10, "the replica to be busy")
        busy.append(pool.submit(_get, f"{proxy.url}/ap", gate=str(gate)))
        wait_for(lambda: proxy.queued("ap") == 1, 10, "the next request to be queued")
        answer, _ = _get(f"{proxy.url}/ap", tag=tag)
        gate.touch()
        # The first ran past the timeout itself: haproxy gave up on the replica.
        assert busy[0].result()[0].status_code == 504
        busy[1].result()
    assert answer.status_code == 504, answer.text
    assert answer.json() == {"kind": "request_timeout",
                             "message": "no replica of ap was free within its request_timeout of 1 s",
                             "request_id": answer.headers["X-Request-ID"]}
    assert tagged(backends["r1"], tag) == []  # never started


def test_a_queued_request_whose_client_left_is_never_started(proxy, deploy, launchers, backends, gate):
    deploy("ap", max_concurrency=1, max_queue_length=5)
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    left, after = uuid.uuid4().hex, uuid.uuid4().hex
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(_get, f"{proxy.url}/ap", gate=str(gate))
        wait_for(lambda: proxy.running("ap") == 1, 10, "the replica to be busy")
        with socket.create_connection(("127.0.0.1", proxy.controller.port)) as client:
            client.sendall(f"GET /ap?tag={left} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            wait_for(lambda: proxy.queued("ap") == 1, 10, "the request to be queued")
        wait_for(lambda: proxy.queued("ap") == 0, 10, "the request to leave the queue")
        later = pool.submit(_get, f"{proxy.url}/ap", tag=after)
        gate.touch()
        assert busy.result()[0].status_code == 200 and later.result()[0].status_code == 200
    assert tagged(backends["r1"], left) == []


# -- traffic splitters ------------------------------------------------------------------------------
def test_a_traffic_splitter_shares_its_requests_by_weight_and_copies_them_to_its_shadow(
        proxy, deploy, launchers, backends, redis_client):
    """Cortex's A/B test: iris at 30/70 between two RealtimeAPIs, every request copied to a recorder."""
    for name, backend in (("iris-onnx", "r1"), ("iris-tf", "r2"), ("recorder", "r3")):
        deploy(name)
        launchers.add(f"{name}-1", name, backends[backend])
    RedisApiRegistry(redis_client).put(TrafficSplitterConfig.model_validate({
        "name": "iris", "kind": "TrafficSplitter",
        "apis": [{"name": "iris-onnx", "weight": 30}, {"name": "iris-tf", "weight": 70},
                 {"name": "recorder", "weight": 100, "shadow": True}]}), "b1")
    proxy.settle_on("iris-onnx-1", "iris-tf-1", "recorder-1")

    tag = uuid.uuid4().hex
    with requests.Session() as session:
        answers = [session.post(f"{proxy.url}/iris", params={"tag": tag}, json={"n": n}, timeout=10)
                   for n in range(1000)]
    assert {answer.status_code for answer in answers} == {200}
    served = Counter(answer.json()["server"] for answer in answers)
    # Every 100 requests in a row give each API exactly its weight (a reload restarts the count).
    assert abs(served["r1"] - 300) <= 20 and served["r1"] + served["r2"] == 1000, served
    assert {answer.json()["path"] for answer in answers} == {"/iris-onnx", "/iris-tf"}

    # The shadow gets a copy of each, body, query and request id included, and its answers go nowhere.
    copies = wait_for(lambda: len(tagged(backends["r3"], tag)) == 1000 and tagged(backends["r3"], tag), 30,
                      "the shadow's 1,000 copies")
    assert {copy["path"] for copy in copies} == {"/recorder"} and {copy["shadow_of"] for copy in copies} == {"iris"}
    assert {copy["body_bytes"] for copy in copies} == {len(b'{"n": 1}'), len(b'{"n": 10}'), len(b'{"n": 100}')}
    assert {copy["request_id"] for copy in copies} == {answer.headers["X-Request-ID"] for answer in answers}

    # What each API was sent reaches the figures, as GET /apis/iris shows it.
    def sent() -> dict[str, float]:
        totals = read_figures(RedisFigureStore(redis_client), [SPLIT_REQUESTS])[SPLIT_REQUESTS.name]
        return {labels[1]: total for labels, total in totals.items() if labels[0] == "iris"}
    wait_for(lambda: sent() == {"iris-onnx": served["r1"], "iris-tf": served["r2"], "recorder": 1000}, 15,
             f"the split counts to reach the figures (so far {sent()})")

    # A body larger than the proxy's buffer is answered as any other, but not copied (it would be cut).
    big, small = uuid.uuid4().hex, uuid.uuid4().hex
    answer = requests.post(f"{proxy.url}/iris", params={"tag": big}, data=b"x" * 64 * 1024, timeout=10)
    assert answer.status_code == 200 and answer.json()["body_bytes"] == 64 * 1024
    requests.post(f"{proxy.url}/iris", params={"tag": small}, data=b"x" * 8 * 1024, timeout=10)
    [copy] = wait_for(lambda: tagged(backends["r3"], small), 10, "the copy of an 8 KiB body")
    assert copy["body_bytes"] == 8 * 1024 and tagged(backends["r3"], big) == []


# -- request ids -----------------------------------------------------------------------------------
def test_a_client_request_id_is_kept_and_a_missing_one_is_made(proxy, deploy, launchers, backends):
    deploy("ap")
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    mine = 'client-id "42"'
    for path in ("/ap", "/apis"):
        kept = requests.get(proxy.url + path, headers={"X-Request-ID": mine}, timeout=10)
        assert kept.headers["X-Request-ID"] == mine and kept.json()["request_id"] == mine
        made = [requests.get(proxy.url + path, timeout=10) for _ in range(2)]
        ids = [answer.headers["X-Request-ID"] for answer in made]
        assert ids[0] != ids[1] and all(len(uuid.UUID(i).hex) == 32 for i in ids)
        assert [answer.json()["request_id"] for answer in made] == ids
    # haproxy's own answers carry it too, JSON-escaped in the body.
    proxy.controller.haproxy.command("@1 disable server rt_ap/ap-1")
    refused = requests.get(proxy.url + "/ap", headers={"X-Request-ID": mine}, timeout=10)
    assert refused.status_code == 503 and refused.headers["X-Request-ID"] == mine
    assert refused.json()["request_id"] == mine


# -- the management API ----------------------------------------------------------------------------
class _Zeros:
    """A large upload, streamed: requests sends a body with __len__ and read() piece by piece."""

    def __init__(self, size: int) -> None:
        self.left, self.size = size, size
        self._chunk = b"\0" * (1 << 20)

    def __len__(self) -> int:
        return self.size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        n = min(n, len(self._chunk))
        self.left -= n
        return self._chunk[:n]


def test_a_200_mib_upload_reaches_the_management_api_whole(proxy):
    size = 210 * 1024 * 1024
    answer = requests.post(f"{proxy.url}/apis", data=_Zeros(size), timeout=120,
                           headers={"Content-Type": "application/octet-stream"})
    assert answer.status_code == 200 and answer.json()["body_bytes"] == size


# -- reloads ---------------------------------------------------------------------------------------
def test_routes_change_under_steady_load_without_losing_a_request(proxy, deploy, launchers, backends):
    deploy("ap", threads_per_process=8)
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    stop = threading.Event()
    failures: list[str] = []
    served: Counter[str] = Counter()
    lock = threading.Lock()

    def client(keep_alive: bool) -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                if keep_alive:
                    answer = session.get(f"{proxy.url}/ap?sleep=0.02", timeout=30)
                else:
                    answer = requests.get(f"{proxy.url}/ap?sleep=0.02", headers={"Connection": "close"}, timeout=30)
                with lock:
                    if answer.status_code == 200:
                        served[answer.json()["server"]] += 1
                    else:
                        failures.append(f"{answer.status_code} {answer.text}")
            except requests.RequestException as e:
                with lock:
                    failures.append(repr(e))

    threads = [threading.Thread(target=client, args=(i % 2 == 0,)) for i in range(6)]
    for thread in threads:
        thread.start()
    try:
        launchers.add("ap-2", "ap", backends["r2"])
        proxy.settle_on("ap-1", "ap-2")
        launchers.drain("ap-1")
        proxy.settle_on("ap-2")
        launchers.add("ap-3", "ap", backends["r3"])
        proxy.settle_on("ap-2", "ap-3")
        launchers.remove("ap-2")
        proxy.settle_on("ap-3")
        launchers.add("ap-1b", "ap", backends["r1"])
        proxy.settle_on("ap-3", "ap-1b")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == []
    assert set(served) == {"r1", "r2", "r3"} and proxy.controller.reloads >= 5


def test_a_draining_replica_is_unrouted_once_no_proxy_can_still_send_it_requests(
        proxy, deploy, launchers, backends, redis_client, gate):
    deploy("ap", threads_per_process=4)
    launchers.add("ap-1", "ap", backends["r1"])
    launchers.add("ap-2", "ap", backends["r2"])
    proxy.settle_on("ap-1", "ap-2")
    assert not unrouted(redis_client, "ap-1", time.time())
    tag = uuid.uuid4().hex
    with ThreadPoolExecutor(2) as pool:
        # A request in flight through the current worker pins it: after the reload it is an old
        # worker still able to talk to ap-1.
        in_flight = [pool.submit(_get, f"{proxy.url}/ap", gate=str(gate), tag=tag) for _ in range(2)]
        wait_for(lambda: len(tagged(backends["r1"], tag)) == 1 and len(tagged(backends["r2"], tag)) == 1, 10,
                 "a request in flight on each replica")
        launchers.drain("ap-1")
        wait_for(lambda: proxy.routes() == {"ap-2"}, 10, "the new routes")
        # The new worker runs, the old one still holds its requests in flight to ap-1 ...
        haproxy = proxy.controller.haproxy
        wait_for(lambda: (s := haproxy.state()) is not None and s.tag == proxy.controller.config_tag
                 and s.old_workers, 10, "the new worker beside the old one")
        reloaded = time.time()

        def published() -> dict[str, Any]:
            return json.loads(redis_client.hget(PROXIES_KEY, proxy.controller.proxy_id))
        wait_for(lambda: published()["seen"] > reloaded, 10, "the proxy to publish again")
        assert published()["routes"] == ["ap-2"] and published()["settled"] is False
        # ... so ap-1 cannot be stopped yet.
        assert not unrouted(redis_client, "ap-1", time.time())
        gate.touch()
        assert [f.result()[0].status_code for f in in_flight] == [200, 200]
    wait_for(lambda: unrouted(redis_client, "ap-1", time.time()), 10, "ap-1 to be unrouted")
    assert not unrouted(redis_client, "ap-2", time.time())
    # A proxy that stops routes nothing.
    proxy.stop()
    assert unrouted(redis_client, "ap-2", time.time())


@pytest.mark.parametrize("victim", ["master", "worker"])
def test_a_haproxy_that_dies_is_started_again(proxy, deploy, launchers, backends, victim):
    deploy("ap")
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    haproxy = proxy.controller.haproxy
    assert haproxy.process is not None
    master = haproxy.process.pid
    state = haproxy.state()
    assert state is not None
    os.kill(master if victim == "master" else state.workers[0], signal.SIGKILL)
    wait_for(lambda: proxy.controller.restarts == 1, 20, "haproxy to be started again")
    wait_for(lambda: proxy.controller.settled, 20, "the new haproxy to serve")
    assert haproxy.process.pid != master
    assert requests.get(f"{proxy.url}/ap", timeout=10).json()["server"] == "r1"


def test_unrouted_only_listens_to_live_proxies(redis_client):
    now = time.time()
    assert unrouted(redis_client, "ap-1", now)  # no proxy: nothing routes it
    stale = {"proxy_id": "gone:8888", "routes": ["ap-1"], "settled": False, "seen": now - 60}
    redis_client.hset(PROXIES_KEY, "gone:8888", json.dumps(stale))
    assert unrouted(redis_client, "ap-1", now)
    live = {"proxy_id": "here:8888", "routes": ["ap-2"], "settled": True, "seen": now}
    redis_client.hset(PROXIES_KEY, "here:8888", json.dumps(live))
    assert unrouted(redis_client, "ap-1", now) and not unrouted(redis_client, "ap-2", now)
    redis_client.hset(PROXIES_KEY, "here:8888", json.dumps({**live, "settled": False}))
    assert not unrouted(redis_client, "ap-1", now)


def test_replica_records_silent_for_long_are_forgotten(proxy, redis_client):
    proxy.controller.forget_every_s = 0.1
    directory = RedisReplicaDirectory(redis_client)
    directory.announce(ReplicaRecord(replica_id="old-1", api="ap", bundle="b1", host="127.0.0.1", port=1,
                                     processes=1, ready=True, draining=False, seen=time.time() - 24 * 3600))
    wait_for(lambda: not redis_client.hexists("sluice:replicas", "old-1"), 10, "the silent record to go")


def test_sluice_proxy_serves_until_sigterm(redis_server, redis_client, deploy, launchers, backends, tmp_path):
    deploy("ap")
    launchers.add("ap-1", "ap", backends["r1"])
    port = free_port()
    env = {**os.environ, "SLUICE_REDIS_URL": redis_server.rsplit("/", 1)[0] + "/1",
           "SLUICE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(HERE.parents[1])}
    log = open(tmp_path / "proxy.log", "wb")  # noqa: SIM115 - the child's output for the whole test
    command = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "proxy", "--port", str(port), "--bind", "127.0.0.1",
         "--management", backends["management"].address], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            try:
                return requests.get(f"{url}/ap", timeout=5).json()["server"] == "r1"
            except (requests.RequestException, ValueError, KeyError):
                return False
        wait_for(serving, 30, "sluice proxy to route /ap")
        assert requests.get(f"{url}/healthz", timeout=5).json()["server"] == "management"
        wait_for(lambda: redis_client.hexists(PROXIES_KEY, f"{socket.gethostname()}:{port}"), 10,
                 "the proxy to publish its routes")
        command.send_signal(signal.SIGTERM)
        assert command.wait(timeout=30) == 0, (tmp_path / "proxy.log").read_text()
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
        log.close()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/ap", timeout=5)
    assert not redis_client.hexists(PROXIES_KEY, f"{socket.gethostname()}:{port}")


# -- figures ---------------------------------------------------------------------------------------
def test_answers_the_proxy_gives_itself_are_counted_by_api_and_reason(proxy, deploy, launchers, backends, gate,
                                                                      redis_client):
    from foundation.figure_store import RedisFigureStore
    from foundation.figures import REALTIME_REJECTED, REALTIME_REQUESTS, read_figures

    deploy("ap", max_concurrency=1, max_queue_length=0, request_timeout=1)
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    assert requests.get(f"{proxy.url}/ap", timeout=10).status_code == 200  # the replica's answer: its own to count
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(_get, f"{proxy.url}/ap", gate=str(gate))
        wait_for(lambda: proxy.running("ap") == 1, 10, "the replica to be busy")
        assert _get(f"{proxy.url}/ap")[0].json()["kind"] == "overloaded"
        assert busy.result()[0].status_code == 504  # ran past its request_timeout: haproxy gave up
    gate.touch()
    proxy.controller.haproxy.command("@1 disable server rt_ap/ap-1")
    assert requests.get(f"{proxy.url}/ap", timeout=10).json()["kind"] == "not_ready"

    expected = {("ap", "overloaded"): 1, ("ap", "request_timeout"): 1, ("ap", "not_ready"): 1}
    wait_for(lambda: read_figures(RedisFigureStore(redis_client))[REALTIME_REJECTED.name] == expected, 10,
             "the refusals to be counted")
    assert read_figures(RedisFigureStore(redis_client))[REALTIME_REQUESTS.name] == {("ap", "503"): 2, ("ap", "504"): 1}


# -- in-flight figures for the scaler --------------------------------------------------------------
@pytest.mark.slow
def test_steady_concurrent_load_through_the_proxy_raises_the_decided_replica_count(
        proxy, redis_client, launchers, backends, gate):
    RedisApiRegistry(redis_client).put(ApiConfig.from_dict({
        "name": "ap", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py", "threads_per_process": 2},
        "autoscaling": {"target_replica_concurrency": 2, "window": "10s", "upscale_stabilization_period": "0s"},
    }), "b1")
    launchers.add("ap-1", "ap", backends["r1"])
    proxy.settle_on("ap-1")
    book, scaling = RedisScaleBook(redis_client), RealtimeScaling()
    registry, loads = RedisApiRegistry(redis_client), RedisProxyLoadBook(redis_client)

    def decided() -> ReplicaScale | None:
        scaling.step(registry, loads, book, time.time())  # beat's step
        return book.get("ap")

    with ThreadPoolExecutor(6) as pool:
        held = [pool.submit(requests.get, f"{proxy.url}/ap", params={"gate": str(gate)}, timeout=60)
                for _ in range(6)]
        # Two run on the replica (its concurrency is 2), four wait in the proxy's queue: six in flight.
        wait_for(lambda: proxy.running("ap") == 2 and proxy.queued("ap") == 4, 20, "six requests in flight")
        scale = wait_for(lambda: (s := decided()) is not None and s.desired > 1 and s, 30,
                         "the scaler to want more than one replica")
        gate.touch()
        assert [answer.result().status_code for answer in held] == [200] * 6

    # 6 in flight / 2 per replica = 3; the first step from one replica may go to two (max_upscale_factor 1.5).
    assert scale.desired == 2
    assert 0 < scale.in_flight <= 6
