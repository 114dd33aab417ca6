"""The haproxy configuration Sluice renders: which paths go where, and the limits of each replica.

Here each rendered configuration is checked for haproxy's layout only;
tests/integration/test_proxy_config_haproxy.py runs the same tests with `haproxy -c` as the check,
so a rule haproxy 2.6 cannot read fails there rather than at the first reload.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from foundation.api_registry import DeployedApi
from foundation.replica_directory import ReplicaRecord
from predictors_runtime.config import ApiConfig
from predictors_runtime.splitter_config import TrafficSplitterConfig
from sluice.proxy_config import (
    DEFAULT_QUEUE_TIMEOUT_S,
    DEFAULT_SERVER_TIMEOUT_S,
    SHADOW_LUA,
    TLS_CIPHERS,
    PublicTls,
    plan_routes,
    plan_splits,
    render_config,
    tag_of,
)
from sluice.proxy_splits import SplitTally, parse_split_table
from sluice.tls.self_signed import make_self_signed
from sluice.tls.served import ServedCertificate

MANAGEMENT = "127.0.0.1:9100"


def deployed(name: str, kind: str = "RealtimeAPI", autoscaling: dict[str, Any] | None = None,
             **predictor: Any) -> DeployedApi:
    config = ApiConfig.from_dict({"name": name, "kind": kind, "predictor": {"path": "predictor.py", **predictor},
                                  **({"autoscaling": autoscaling} if autoscaling is not None else {})})
    return DeployedApi(name=name, kind=kind, spec=config.to_dict(), bundle="b1", queue=config.queue,
                       deployed_at=0.0, ignored_fields=[])


def replica(replica_id: str, api: str, port: int, host: str = "127.0.0.1") -> ReplicaRecord:
    return ReplicaRecord(replica_id=replica_id, api=api, bundle="b1", host=host, port=port, processes=1,
                         ready=True, draining=False, seen=1000.0)


def render(apis: list[DeployedApi], replicas: list[ReplicaRecord]) -> str:
    return render_config(plan_routes(apis, replicas), bind="127.0.0.1", port=8888, management=MANAGEMENT)


def section(config: str, header: str) -> list[str]:
    """The lines of one section (`backend rt_x`, `frontend public`), stripped."""
    lines, inside = [], False
    for line in config.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == header
            continue
        if inside:
            lines.append(line.strip())
    return lines


def routing_table(config: str) -> dict[str, str]:
    """path -> backend, from the frontend's `use_backend ... if { path ... }` rules."""
    table = {}
    for line in section(config, "frontend public"):
        match = re.fullmatch(r"use_backend (\S+) if \{ path ((?:\S+ )+)\}", line)
        if match:
            for path in match.group(2).split():
                table[path] = match.group(1)
    return table


def backend_for(config: str, path: str) -> str:
    return routing_table(config).get(path, "management")


SECTIONS = {"global", "defaults", "frontend", "backend"}
_UNESCAPED_QUOTE = re.compile(r'(?<!\\)"')


def haproxy_layout(config: str) -> None:
    """Sections at the margin, each of their lines indented under one, every quoted string closed."""
    lines = [line for line in config.splitlines() if line.strip() and not line.startswith("#")]
    assert lines and not lines[0].startswith(" "), lines[:1]
    for line in lines:
        if not line.startswith(" "):
            assert line.split()[0] in SECTIONS, line
        else:
            assert line.startswith("    ") and not line.startswith("     "), line
        assert len(_UNESCAPED_QUOTE.findall(line)) % 2 == 0, line


@pytest.fixture
def haproxy_accepts() -> Callable[[str], None]:
    """The check every rendered configuration passes: its layout here, `haproxy -c` itself in
    tests/integration/test_proxy_config_haproxy.py, which runs these tests again."""
    return haproxy_layout


def test_without_realtime_apis_every_path_goes_to_the_management_api(haproxy_accepts):
    config = render([deployed("scorer", kind="BatchAPI")], [replica("scorer-1", "scorer", 9001)])
    haproxy_accepts(config)
    assert routing_table(config) == {}
    assert "default_backend management" in section(config, "frontend public")
    assert section(config, "backend management")[-1] == f"server management {MANAGEMENT}"
    assert "backend rt_" not in config


def test_a_realtime_api_without_a_routable_replica_is_left_to_the_management_api(haproxy_accepts):
    # The management API's fallback says why (starting, failed to build, ...).
    config = render([deployed("iris")], [])
    haproxy_accepts(config)
    assert backend_for(config, "/iris") == "management"
    assert "backend rt_iris" not in config


def test_one_replica_gets_the_api_path_exactly_and_with_a_trailing_slash(haproxy_accepts):
    config = render([deployed("iris", threads_per_process=4)], [replica("iris-9001-aa", "iris", 9001)])
    haproxy_accepts(config)
    assert routing_table(config) == {"/iris": "rt_iris", "/iris/": "rt_iris"}
    backend = section(config, "backend rt_iris")
    assert "balance leastconn" in backend
    assert backend[-1] == "server iris-9001-aa 127.0.0.1:9001 maxconn 4"
    assert "http-reuse always" not in backend  # gthread processes take every connection offered: see below


def test_two_replicas_share_one_backend_whose_queue_limit_is_per_replica(haproxy_accepts):
    api = deployed("iris", processes_per_replica=2, threads_per_process=3, max_queue_length=5)
    config = render([api], [replica("iris-b", "iris", 9002, host="10.0.0.2"), replica("iris-a", "iris", 9001)])
    haproxy_accepts(config)
    backend = section(config, "backend rt_iris")
    assert [line for line in backend if line.startswith("server ")] == [
        "server iris-a 127.0.0.1:9001 maxconn 6",
        "server iris-b 10.0.0.2:9002 maxconn 6",
    ]
    overload = next(line for line in backend if "overloaded" in line)
    assert overload.startswith("http-request return status 503 ")
    assert "hdr Retry-After 1" in overload
    assert overload.endswith("if { queue() ge 10 } { be_conn_free eq 0 }")
    not_ready = next(line for line in backend if "no replica of iris is ready" in line)
    assert not_ready.endswith("if !{ srv_is_up(rt_iris/iris-a) } !{ srv_is_up(rt_iris/iris-b) }")


def test_requests_reuse_kept_connections_only_to_processes_that_serve_one_at_a_time(haproxy_accepts):
    for predictor, reused in [
        ({}, True),  # one request at a time per process: the keep-alive sync worker
        ({"threads_per_process": 2}, False),
        ({"threads_per_process": 8, "server_side_batching": {"max_batch_size": 4, "batch_interval": 0.01}}, False),
    ]:
        config = render([deployed("iris", **predictor)], [replica("iris-a", "iris", 9001)])
        haproxy_accepts(config)
        backend = section(config, "backend rt_iris")
        assert ("http-reuse always" in backend) is reused, predictor


def test_limits_come_from_the_predictor_config(haproxy_accepts):
    api = deployed("iris", max_concurrency=7, max_queue_length=0, request_timeout=2.5)
    config = render([api], [replica("iris-a", "iris", 9001)])
    haproxy_accepts(config)
    backend = section(config, "backend rt_iris")
    assert backend[-1].endswith("maxconn 7")
    assert "timeout queue 2500ms" in backend
    assert "timeout server 2500ms" in backend
    # No queue at all: refused as soon as every replica is busy.
    assert any(line.endswith("if { queue() ge 0 } { be_conn_free eq 0 }") for line in backend)
    assert "http-request set-var(txn.deadline_ms) date(0,ms),add(2500)" in backend
    assert "http-request set-header X-Sluice-Deadline-Ms %[var(txn.deadline_ms)]" in backend
    assert "option abortonclose" in backend
    assert any(line.startswith("http-error status 504 ") and "request_timeout" in line for line in backend)
    assert any(line.startswith("http-request return status 503 ") and line.endswith("if !{ srv_is_up(rt_iris/iris-a) }")
               and '"kind": "not_ready", "message": "no replica of iris is ready"' in line.replace("\\", "")
               for line in backend)


def test_max_replica_concurrency_sizes_each_replicas_queue_to_what_it_leaves_beyond_the_running(haproxy_accepts):
    # Cortex's limit is running plus queued per replica: 2 processes x 3 threads run, 4 more may wait.
    api = deployed("iris", processes_per_replica=2, threads_per_process=3,
                   autoscaling={"max_replica_concurrency": 10, "target_replica_concurrency": 6})
    config = render([api], [replica("iris-a", "iris", 9001), replica("iris-b", "iris", 9002)])
    haproxy_accepts(config)
    backend = section(config, "backend rt_iris")
    assert [line for line in backend if line.startswith("server ")] == [
        "server iris-a 127.0.0.1:9001 maxconn 6",
        "server iris-b 127.0.0.1:9002 maxconn 6",
    ]
    # The shared queue holds 4 per routed replica: 2 x (6 running + 4 queued) = 2 x 10 in all.
    assert next(line for line in backend if "overloaded" in line).endswith("if { queue() ge 8 } { be_conn_free eq 0 }")


def test_an_unwritten_max_replica_concurrency_leaves_the_queue_at_max_queue_lengths_default(haproxy_accepts):
    # Cortex's default of 1024 is not applied: a stored config says "not written", not 1024.
    api = deployed("iris", threads_per_process=2, autoscaling={"min_replicas": 1})
    assert api.spec["autoscaling"]["max_replica_concurrency"] is None
    assert api.spec["predictor"]["max_queue_length"] is None
    config = render([api], [replica("iris-a", "iris", 9001)])
    haproxy_accepts(config)
    assert next(line for line in section(config, "backend rt_iris") if "overloaded" in line).endswith(
        "if { queue() ge 100 } { be_conn_free eq 0 }")


def test_a_written_max_queue_length_within_max_replica_concurrency_is_kept(haproxy_accepts):
    api = deployed("iris", max_concurrency=2, max_queue_length=1,
                   autoscaling={"max_replica_concurrency": 8, "target_replica_concurrency": 2})
    config = render([api], [replica("iris-a", "iris", 9001)])
    haproxy_accepts(config)
    backend = section(config, "backend rt_iris")
    assert backend[-1].endswith("maxconn 2")
    assert next(line for line in backend if "overloaded" in line).endswith("if { queue() ge 1 } { be_conn_free eq 0 }")


def test_without_request_timeout_waits_are_generous_and_no_deadline_is_sent(haproxy_accepts):
    config = render([deployed("iris")], [replica("iris-a", "iris", 9001)])
    haproxy_accepts(config)
    backend = section(config, "backend rt_iris")
    assert f"timeout queue {int(DEFAULT_QUEUE_TIMEOUT_S * 1000)}ms" in backend
    assert f"timeout server {int(DEFAULT_SERVER_TIMEOUT_S * 1000)}ms" in backend
    assert not any("X-Sluice-Deadline-Ms" in line for line in backend)
    # ... and old workers get time to finish the longest request they may hold.
    hard_stop = int(re.search(r"hard-stop-after (\d+)s", config).group(1))
    assert hard_stop > DEFAULT_QUEUE_TIMEOUT_S + DEFAULT_SERVER_TIMEOUT_S


def test_names_are_routed_exactly(haproxy_accepts):
    apis = [deployed("ap"), deployed("batch-x", kind="BatchAPI"), deployed("x")]
    replicas = [replica("ap-1", "ap", 9001), replica("x-1", "x", 9002), replica("b-1", "batch-x", 9003)]
    config = render(apis, replicas)
    haproxy_accepts(config)
    assert backend_for(config, "/ap") == "rt_ap"
    assert backend_for(config, "/x/") == "rt_x"
    for path in ("/apis", "/apis/ap", "/ap/x", "/apx", "/batch/x", "/batch/ap", "/batch-x", "/healthz",
                 "/metrics", "/openapi.json", "/", "/unknown"):
        assert backend_for(config, path) == "management", path
    assert "rt_batch-x" not in config


def test_every_answer_carries_a_request_id_and_clients_cannot_set_the_deadline(haproxy_accepts):
    config = render([deployed("ap", request_timeout=1)], [replica("ap-1", "ap", 9001)])
    haproxy_accepts(config)
    frontend = section(config, "frontend public")
    assert "http-request set-header X-Request-ID %[uuid] unless { req.fhdr(x-request-id) -m len gt 0 }" in frontend
    assert "http-after-response set-header X-Request-ID %[var(txn.request_id)]" in frontend
    assert "http-request del-header X-Sluice-Deadline-Ms" in frontend
    # The JSON bodies quote the client's id through haproxy's JSON escaping.
    assert "json(utf8s)" in config


def test_replicas_of_other_apis_or_with_unusable_addresses_are_not_routed(haproxy_accepts):
    replicas = [
        replica("ap-1", "ap", 9001),
        replica("gone-1", "deleted-api", 9002),
        replica("evil", "ap", 9003, host="1.2.3.4:80 maxconn 100000\n    server x 5.6.7.8"),
        replica("v6", "ap", 9004, host="::1"),
    ]
    routes = plan_routes([deployed("ap")], replicas)
    assert [route.replica_ids for route in routes] == [("ap-1", "v6")]
    config = render([deployed("ap")], replicas)
    haproxy_accepts(config)
    assert "server v6 [::1]:9004 maxconn 1" in section(config, "backend rt_ap")
    assert "5.6.7.8" not in config and "deleted-api" not in config


def test_the_same_routes_give_the_same_text_and_new_routes_a_new_tag():
    apis = [deployed("ap")]
    first = render(apis, [replica("ap-1", "ap", 9001)])
    assert render(apis, [replica("ap-1", "ap", 9001)]) == first
    second = render(apis, [replica("ap-1", "ap", 9001), replica("ap-2", "ap", 9002)])
    assert tag_of(first) and tag_of(second) and tag_of(first) != tag_of(second)


def test_a_management_address_that_is_not_host_and_port_is_refused():
    with pytest.raises(ValueError, match="management address must be host:port"):
        render_config([], bind="127.0.0.1", port=8888, management="nowhere")


def test_a_replica_on_the_proxy_host_is_reached_over_its_unix_socket_the_others_over_tcp(haproxy_accepts):
    from dataclasses import replace

    api = deployed("iris", processes_per_replica=2)
    local = replace(replica("iris-a", "iris", 9001), socket="/tmp/sluice-replica-a.sock", host_id="here")
    remote = replace(replica("iris-b", "iris", 9002, host="10.0.0.2"), socket="/tmp/sluice-replica-b.sock",
                     host_id="there")
    routes = plan_routes([api], [local, remote], local_socket=lambda r: r.socket if r.host_id == "here" else None)
    config = render_config(routes, bind="127.0.0.1", port=8888, management=MANAGEMENT)
    haproxy_accepts(config)
    assert [line for line in section(config, "backend rt_iris") if line.startswith("server ")] == [
        "server iris-a unix@/tmp/sluice-replica-a.sock maxconn 2",
        "server iris-b 10.0.0.2:9002 maxconn 2",
    ]


def test_haproxy_is_tied_to_its_controller_with_the_race_checked(tmp_path, monkeypatch):
    """haproxy's preexec is the foundation's `die_with_parent` for this very process (it used a
    copy without the check for a controller that died while forking)."""
    import subprocess

    from sluice import haproxy

    started: dict = {}

    class Recorded:
        pid = os.getpid()

        def __init__(self, argv, **kwargs):
            started.update(kwargs)

    monkeypatch.setattr(haproxy.shutil, "which", lambda name: "/usr/sbin/haproxy")
    monkeypatch.setattr(subprocess, "Popen", Recorded)
    haproxy.HAProxy(tmp_path, executable="/usr/sbin/haproxy", priority=-7).start()

    # It asks for its priority, then ties itself to this very process.
    outer = started["preexec_fn"]
    assert outer.__qualname__ == "_prioritised.<locals>.preexec"
    cells = {type(cell.cell_contents).__name__: cell.cell_contents for cell in outer.__closure__ or ()}
    assert cells["int"] == -7
    preexec = cells["function"]
    assert preexec.__qualname__ == "die_with_parent.<locals>.preexec"
    assert preexec.__closure__ is not None
    assert os.getpid() in [cell.cell_contents for cell in preexec.__closure__]


def test_the_proxys_priority_is_a_nice_value_minus_ten_unless_set():
    from foundation.errors import ConfigError
    from sluice.haproxy import proxy_priority

    assert proxy_priority({}) == -10
    assert proxy_priority({"SLUICE_PROXY_PRIORITY": "0"}) == 0
    for bad in ("-21", "20", "high"):
        with pytest.raises(ConfigError, match="a nice value from -20 to 19"):
            proxy_priority({"SLUICE_PROXY_PRIORITY": bad})


# -- traffic splitters ------------------------------------------------------------------------------
def splitter(name: str, *apis: dict[str, Any]) -> DeployedApi:
    config = TrafficSplitterConfig.model_validate({"name": name, "kind": "TrafficSplitter", "apis": list(apis)})
    return DeployedApi(name=name, kind=config.kind, spec=config.to_dict(), bundle="b1", queue=config.queue,
                       deployed_at=0.0, ignored_fields=[])


def render_split(apis: list[DeployedApi], replicas: list[ReplicaRecord]) -> str:
    return render_config(plan_routes(apis, replicas), bind="0.0.0.0", port=8888, management=MANAGEMENT,
                         splits=plan_splits(apis))


def drawn(config: str, name: str, requests: int) -> Counter[str]:
    """Where `requests` consecutive requests to /<name> go, by the frontend's rules as haproxy runs
    them: the draw is the splitter's counter (1, 2, ...) through its converters, and the first
    `set-path` whose threshold the draw is under rewrites the path."""
    frontend = section(config, "frontend public")
    [draw] = [line for line in frontend if line.startswith("http-request set-var(txn.split) ")]
    step, modulus = map(int, re.fullmatch(r".*sc_inc_gpc0\(1\),mul\((\d+)\),mod\((\d+)\) if .*", draw).groups())
    rules = [re.fullmatch(rf"http-request set-path /(\S+) if \{{ path /{name} /{name}/ }} "
                          r"\{ var\(txn.split\) -m int lt (\d+) \}", line) for line in frontend]
    thresholds = [(m.group(1), int(m.group(2))) for m in rules if m]
    return Counter(next(api for api, upto in thresholds if (n * step) % modulus < upto)
                   for n in range(1, requests + 1))


def test_a_splitter_gives_every_hundred_requests_in_a_row_exactly_their_weights(haproxy_accepts):
    apis = [deployed("iris-onnx"), deployed("iris-tf"), deployed("iris-old"),
            splitter("iris", {"name": "iris-onnx", "weight": 30}, {"name": "iris-tf", "weight": 70},
                     {"name": "iris-old", "weight": 0})]
    config = render_split(apis, [replica("onnx-1", "iris-onnx", 9001), replica("tf-1", "iris-tf", 9002)])
    haproxy_accepts(config)
    for start in range(0, 1000, 100):
        assert drawn(config, "iris", start + 100) - drawn(config, "iris", start) == {"iris-onnx": 30, "iris-tf": 70}
    # Spread through the hundred, not one run per API: no more than 3 requests in a row go to iris-onnx.
    order = [api for api, _ in sorted(
        ((api, n) for n in range(1, 101) for api in drawn(config, "iris", n) - drawn(config, "iris", n - 1)),
        key=lambda pair: pair[1])]
    assert max(len(run) for run in "".join("a" if api == "iris-onnx" else " " for api in order).split()) <= 3
    # The rewritten path is then routed as a request to that API; a weight of 0 is never drawn.
    assert backend_for(config, "/iris-onnx") == "rt_iris-onnx" and backend_for(config, "/iris") == "management"
    assert "/iris-old" not in config
    assert "lua-load" not in config


def test_a_shadow_gets_a_copy_of_its_percentage_through_the_proxys_own_address(haproxy_accepts):
    apis = [deployed("a"), deployed("rec"), splitter("s", {"name": "a", "weight": 100},
                                                     {"name": "rec", "weight": 25, "shadow": True})]
    config = render_split(apis, [replica("a-1", "a", 9001)])
    haproxy_accepts(config)
    frontend = section(config, "frontend public")
    at = "{ path /s /s/ }"
    assert f"http-request set-var(txn.shadow_draw) rand(100) if {at}" in frontend
    copied = f"{at} {{ var(txn.shadow_draw) -m int lt 25 }}"
    assert f"http-request lua.sluice_shadow http://127.0.0.1:8888 /rec s if {copied}" in frontend
    assert frontend.index(f"http-request wait-for-body time 30000ms if {at}") < \
        next(i for i, line in enumerate(frontend) if line.startswith("http-request lua.sluice_shadow"))
    assert f'lua-load "{SHADOW_LUA}"' in config and SHADOW_LUA.is_file()
    assert "stick-table type string len 128 size 10k store gpc0,gpc1,http_req_cnt" in section(
        config, "backend sluice_split")


def test_a_splitter_is_rendered_whether_or_not_its_apis_have_replicas(haproxy_accepts):
    config = render_split([deployed("a"), splitter("s", {"name": "a", "weight": 100})], [])
    haproxy_accepts(config)
    assert drawn(config, "s", 10) == {"a": 10}  # /a has no backend: the management API says why


def test_split_counters_are_read_per_worker_and_only_their_growth_counted():
    table = ("# table: sluice_split, type: string, size:10240, used:3\n"
             "0x55d0: key=iris use=0 exp=0 gpc0=10 gpc1=4 http_req_cnt=10\n"
             "0x55d1: key=iris/iris-onnx use=0 exp=0 gpc0=0 gpc1=0 http_req_cnt=3\n"
             "0x55d2: key=iris/iris-tf use=0 exp=0 gpc0=0 gpc1=0 http_req_cnt=7\n")
    read = parse_split_table(table)
    assert read == {("iris", ""): 4, ("iris", "iris-onnx"): 3, ("iris", "iris-tf"): 7}
    tally = SplitTally()
    assert tally.update({100: read}, {"iris": "rec"}) == {("iris", "rec"): 4, ("iris", "iris-onnx"): 3,
                                                            ("iris", "iris-tf"): 7}
    grown = {**read, ("iris", "iris-tf"): 9}
    assert tally.update({100: grown, 200: {("iris", "iris-onnx"): 1}}, {"iris": "rec"}) == {
        ("iris", "iris-tf"): 2, ("iris", "iris-onnx"): 1}
    tally.forget_except({200})
    assert tally.update({100: grown}, {}) == {("iris", "iris-onnx"): 3, ("iris", "iris-tf"): 9}


# -- gRPC ------------------------------------------------------------------------------------------------
def test_a_grpc_api_is_routed_by_its_package_over_http2_and_refused_in_grpc_terms(haproxy_accepts):
    api = deployed("iris-classifier", protobuf_path="iris_classifier.proto", threads_per_process=4)
    config = render_config(plan_routes([api, deployed("web")], [replica("g-1", "iris-classifier", 9001),
                                                                replica("w-1", "web", 9002)]),
                           bind="127.0.0.1", port=8888, management=MANAGEMENT, keys_file=os.devnull)
    haproxy_accepts(config)
    frontend = section(config, "frontend public")
    assert "use_backend rt_iris-classifier if { path_beg /iris_classifier. }" in frontend
    assert backend_for(config, "/iris-classifier") == "management"  # its own path: readiness, from the management API
    backend = section(config, "backend rt_iris-classifier")
    assert backend[-1] == "server g-1 127.0.0.1:9001 maxconn 4 proto h2"
    refusals = [line for line in backend if line.startswith("http-request return")]
    assert refusals and all("status 200 content-type application/grpc hdr grpc-status " in r for r in refusals)
    assert any("grpc-status 16" in r and "unauthorized" in r for r in refusals)
    assert any("grpc-status 14" in r and "overloaded" in r for r in refusals)
    # An HTTP API beside it keeps its JSON answers and HTTP/1.1 servers.
    web = section(config, "backend rt_web")
    assert web[-1] == "server w-1 127.0.0.1:9002 maxconn 1" and not any("grpc" in line for line in web)


@functools.cache
def _served_pem() -> PublicTls:
    """A certificate and key in one PEM file, as the controller writes it (made once per run)."""
    folder = Path(tempfile.mkdtemp(prefix="sluice-test-tls-"))
    made = make_self_signed(folder / "made", ["localhost"])
    served = ServedCertificate(made.cert, made.key, folder / "state")
    served.load()
    return PublicTls(str(served.combined), served.digest)


def test_with_a_certificate_the_public_port_serves_tls_12_or_13_only_with_h2_by_alpn(haproxy_accepts):
    apis = [deployed("a"), deployed("rec"), splitter("s", {"name": "a", "weight": 100},
                                                     {"name": "rec", "weight": 25, "shadow": True})]
    tls = _served_pem()
    config = render_config(plan_routes(apis, [replica("a-1", "a", 9001)]), bind="127.0.0.1", port=8443,
                           management=MANAGEMENT, splits=plan_splits(apis), tls=tls)
    haproxy_accepts(config)
    frontend = section(config, "frontend public")
    assert frontend[0] == f'bind 127.0.0.1:8443 ssl crt "{tls.pem}" alpn h2,http/1.1  # certificate {tls.digest}'
    # The management API is told the client came over TLS (whatever the client claimed).
    assert "http-request set-header X-Forwarded-Proto https" in frontend
    globals_ = section(config, "global")
    assert "ssl-default-bind-options ssl-min-ver TLSv1.2 no-tls-tickets" in globals_
    # Forward secrecy and AEAD only: no static RSA key exchange, no CBC.
    assert all(c.startswith("ECDHE-") and ("GCM" in c or "CHACHA20" in c) for c in TLS_CIPHERS.split(":"))
    assert f"ssl-default-bind-ciphers {TLS_CIPHERS}" in globals_
    # A shadow's copy goes to the proxy's own port over TLS (loopback: its certificate is not checked).
    assert any(line.startswith("http-request lua.sluice_shadow https://127.0.0.1:8443 /rec s") for line in frontend)
    assert "httpclient.ssl.verify none" in globals_


def test_a_renewed_certificate_is_a_new_configuration_and_plain_http_says_so(haproxy_accepts):
    routes = plan_routes([deployed("a")], [replica("a-1", "a", 9001)])
    plain = render_config(routes, bind="127.0.0.1", port=8888, management=MANAGEMENT)
    haproxy_accepts(plain)
    assert "http-request set-header X-Forwarded-Proto http" in section(plain, "frontend public")
    assert "ssl" not in section(plain, "frontend public")[0]
    tls = _served_pem()
    first = render_config(routes, bind="127.0.0.1", port=8888, management=MANAGEMENT, tls=tls)
    renewed = render_config(routes, bind="127.0.0.1", port=8888, management=MANAGEMENT,
                            tls=PublicTls(tls.pem, "0" * 16))
    assert tag_of(first) != tag_of(renewed) != tag_of(plain)


def test_replicas_serving_tls_and_an_https_management_api_are_reached_over_checked_tls(haproxy_accepts):
    tls_replica = ReplicaRecord(replica_id="a-1", api="a", bundle="b1", host="10.0.0.7", port=9001, processes=1,
                                ready=True, draining=False, seen=1000.0, tls=True)
    routes = plan_routes([deployed("a")], [tls_replica, replica("a-2", "a", 9002)], backend_ca="@system-ca")
    config = render_config(routes, bind="127.0.0.1", port=8888, management="https://10.0.0.5:8000",
                           backend_ca="@system-ca")
    haproxy_accepts(config)
    servers = [line for line in section(config, "backend rt_a") if line.startswith("server ")]
    assert servers == [
        'server a-1 10.0.0.7:9001 maxconn 1 ssl verify required ca-file "@system-ca" verifyhost 10.0.0.7',
        "server a-2 127.0.0.1:9002 maxconn 1",  # a replica of a host without a certificate: plain
    ]
    assert section(config, "backend management")[-1] == (
        'server management 10.0.0.5:8000 ssl verify required ca-file "@system-ca" verifyhost 10.0.0.5')


def test_a_grpc_replica_serving_tls_is_offered_http2_by_alpn(haproxy_accepts):
    tls_replica = ReplicaRecord(replica_id="g-1", api="iris-grpc", bundle="b1", host="10.0.0.7", port=9001,
                                processes=1, ready=True, draining=False, seen=1000.0, tls=True)
    routes = plan_routes([deployed("iris-grpc", protobuf_path="iris.proto")], [tls_replica])
    config = render_config(routes, bind="127.0.0.1", port=8888, management=MANAGEMENT)
    haproxy_accepts(config)
    [server] = [line for line in section(config, "backend rt_iris-grpc") if line.startswith("server ")]
    assert server.endswith('proto h2 ssl verify required ca-file "@system-ca" verifyhost 10.0.0.7 alpn h2')
