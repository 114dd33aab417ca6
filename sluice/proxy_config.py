"""The HAProxy configuration of Sluice's public entry point, rendered from the deployed APIs.

`/<api>` (exactly, or with a trailing slash) of a RealtimeAPI with at least one routable replica
goes straight to that API's replicas; everything else (`/apis`, `/batch/...`, `/healthz`, unknown
names, BatchAPIs, a realtime API with no replica yet) goes to the management API, which answers
for itself or explains why no replica took the request. No Python process sits in the path of a
prediction.

Why each limit lives here (see PITFALLS "Realtime serving"): a replica's concurrency is enforced
where all of its processes are seen, so haproxy gives each replica `maxconn` = the API's
`replica_concurrency`, queues what is beyond in the API's backend (one queue shared by all its
replicas, served least-connections first), refuses at once what is beyond `max_queue_length`
per replica, and bounds the wait and the run by `request_timeout`. Cortex's
`autoscaling.max_replica_concurrency` (running plus queued per replica), when written, sizes that
queue: `max_replica_concurrency - replica_concurrency` per replica (`ApiConfig.replica_queue_length`).

HAProxy 2.6 answers a queue timeout with a 503 like any other failure to reach a server, so the
replica backends' own 503 tells the two apart by the clock: a request that is past its deadline
timed out (504 `request_timeout`), one that is not could not reach a replica (503 `not_ready`).
`request_timeout` bounds the wait in the queue and, separately, the run on a replica (haproxy has
no timer over both); the replica gets the deadline (`X-Sluice-Deadline-Ms`) and refuses work
already past it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from foundation.api_kinds import ApiKind
from foundation.api_registry import DeployedApi
from foundation.errors import ConfigError
from foundation.replica_directory import ReplicaRecord
from predictors_runtime.config import ApiConfig
from predictors_runtime.grpc_proto import grpc_path_prefix
from predictors_runtime.splitter_config import WEIGHT_TOTAL, TrafficSplitterConfig

from .proxy_rejections import REASON_INDEX, TABLE
from .proxy_splits import SPLIT_TABLE, split_key
from .replica_process import keeps_connections

log = logging.getLogger(__name__)

# Without `request_timeout`: how long a request may wait for a free replica, and run on one.
DEFAULT_QUEUE_TIMEOUT_S = 300.0
DEFAULT_SERVER_TIMEOUT_S = 3600.0
# The management API: long requests (a job listing, a stop) and 200 MiB deploy uploads.
MANAGEMENT_TIMEOUT_S = 330.0
# A client that sends nothing for this long, mid-request, is dropped (it never limits how long a
# server may take to answer).
CLIENT_TIMEOUT_S = 120.0
HEADERS_TIMEOUT_S = 30.0
KEEP_ALIVE_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
# An old haproxy worker still serving requests of a previous configuration stops at the latest
# this long after the longest request it may hold has to be over.
HARD_STOP_MARGIN_S = 30.0
# A 503 of haproxy's own this close to the deadline counts as a timed-out wait (timers tick in ms).
DEADLINE_SLACK_MS = 50
# Replicas whose processes keep connections (`keeps_connections`): any idle connection carries the next
# request, whoever sent it, instead of a new connection per request (1.2-1.5x the requests/s through
# the proxy, bench/proxy_hop.py). A replica keeps an idle connection longer than haproxy does, so
# haproxy never sends a request on one the replica is closing; a process that finds requests queued
# on its connections closes one with its answer, so that the connections spread over the processes
# free to run them (sluice/keepalive_worker.py).
REUSE_LINE = "    http-reuse always"

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")
_BACKEND_PREFIX = "rt_"  # a realtime API's backend is named rt_<api>
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_BIG = 10**12  # larger than any |now - deadline| in ms; see _late
SHADOW_LUA = Path(__file__).resolve().parent / "lua" / "shadow.lua"


@dataclass(frozen=True)
class Server:
    """One replica as a haproxy server line; `tls_ca`: reached over TLS, its certificate checked
    against this CA file (haproxy's `@system-ca` for the system's) and its name against `host`."""

    name: str
    address: str
    replica_id: str
    tls_ca: str | None = None
    host: str = ""


@dataclass(frozen=True)
class Route:
    """One realtime API's backend: its replicas and limits."""

    api: str
    servers: tuple[Server, ...]
    concurrency: int                  # per replica (haproxy server maxconn)
    queue_length: int                 # per routed replica
    request_timeout_s: float | None
    # A gRPC API: its calls are routed by this path prefix (`/<package>.`) over HTTP/2.
    grpc_prefix: str | None = None
    # Its replicas' processes serve any kept connection (`keeps_connections`): requests reuse them.
    reuse: bool = False

    @property
    def backend(self) -> str:
        return f"{_BACKEND_PREFIX}{self.api}"

    @property
    def queue_limit(self) -> int:
        """Requests the backend queues before it refuses more."""
        return self.queue_length * len(self.servers)

    @property
    def queue_timeout_s(self) -> float:
        return self.request_timeout_s if self.request_timeout_s is not None else DEFAULT_QUEUE_TIMEOUT_S

    @property
    def server_timeout_s(self) -> float:
        return self.request_timeout_s if self.request_timeout_s is not None else DEFAULT_SERVER_TIMEOUT_S

    @property
    def replica_ids(self) -> tuple[str, ...]:
        return tuple(s.replica_id for s in self.servers)


@dataclass(frozen=True)
class PublicTls:
    """TLS on the public port: the PEM file haproxy serves (chain and key) and that pair's digest."""

    pem: str
    digest: str


# TLS 1.2 and 1.3 only, with forward-secret AEAD ciphers (the "intermediate" profile most guides
# recommend: every client of the last decade, nothing weaker).
TLS_CIPHERS = ":".join([
    "ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305",
])
TLS_CIPHERSUITES = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"


@dataclass(frozen=True)
class Split:
    """One TrafficSplitter: the requests to its path shared among RealtimeAPIs by weight."""

    name: str
    shares: tuple[tuple[str, int], ...]   # (api, weight), weights > 0 adding up to 100
    shadow: tuple[str, int] | None        # (api, percent of requests copied to it)


def plan_splits(apis: Iterable[DeployedApi]) -> list[Split]:
    """The splitters to render: every deployed TrafficSplitter, whether or not its APIs have replicas
    (a request shared to an API without one gets the management API's answer for that API)."""
    splits = []
    for api in sorted(apis, key=lambda a: a.name):
        if api.kind != ApiKind.TRAFFIC_SPLITTER or not _NAME_RE.match(api.name):
            continue
        try:
            config = TrafficSplitterConfig.from_dict(api.spec)
        except ConfigError as e:
            log.warning("traffic splitter %s has a config this version cannot read; not routed: %s", api.name, e)
            continue
        shadow = config.shadow
        splits.append(Split(
            name=api.name,
            shares=tuple((t.name, t.weight) for t in config.shared if t.weight > 0),
            shadow=(shadow.name, shadow.weight) if shadow is not None and shadow.weight > 0 else None,
        ))
    return splits


def in_flight_by_api(stats: Iterable[dict[str, str]]) -> dict[str, int]:
    """Each realtime backend's requests in flight, from haproxy's `show stat` rows: its BACKEND
    row's `scur`.

    A backend's `scur` counts every request assigned to it, those running at its servers and those
    waiting in its queue or a server's queue alike (measured on 2.6: 3 running and 8 queued read
    scur 11, qcur 8), so adding `qcur` would count the queued twice.
    """
    found: dict[str, int] = {}
    for row in stats:
        name = row.get("pxname", "")
        if row.get("svname") != "BACKEND" or not name.startswith(_BACKEND_PREFIX):
            continue
        try:
            found[name[len(_BACKEND_PREFIX):]] = int(row.get("scur") or 0)
        except ValueError:
            continue
    return found


def format_address(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal in brackets (as haproxy reads it)."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _valid_address(host: str, port: int) -> bool:
    """Only plain host names and IP literals: a record must never be able to edit the config."""
    return bool(_HOST_RE.match(host.strip("[]"))) and isinstance(port, int) and 0 < port < 65536


def _server_name(replica_id: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.:-]", "_", replica_id)[:100] or "replica"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def _server_address(record: ReplicaRecord, local_socket: Callable[[ReplicaRecord], str | None] | None) -> str:
    """Where haproxy reaches a replica: its Unix socket when it runs on this host, else host:port."""
    path = local_socket(record) if local_socket is not None else None
    return f"unix@{path}" if path else format_address(record.host, record.port)


def plan_routes(apis: Iterable[DeployedApi], replicas: Iterable[ReplicaRecord],
                local_socket: Callable[[ReplicaRecord], str | None] | None = None,
                backend_ca: str = "@system-ca") -> list[Route]:
    """The realtime backends to render: one per deployed RealtimeAPI with routable replicas.

    `replicas` are the ones the caller found routable (`ReplicaDirectory.routable(now)`); those of
    an API that is not a deployed RealtimeAPI, or with an address haproxy could not read, are
    left out. An API with none is not routed: the management API answers it (and says why). A
    replica that serves TLS (`record.tls`) is reached over TLS, checked against `backend_ca`.
    """
    by_api: dict[str, list[ReplicaRecord]] = {}
    for record in replicas:
        if not _valid_address(record.host, record.port):
            log.warning("replica %s has an unusable address %r; not routed", record.replica_id, record.address)
            continue
        by_api.setdefault(record.api, []).append(record)
    routes = []
    for api in sorted(apis, key=lambda a: a.name):
        if api.kind != ApiKind.REALTIME or not _NAME_RE.match(api.name) or not by_api.get(api.name):
            continue
        try:
            config = ApiConfig.from_dict(api.spec)
        except ConfigError as e:
            log.warning("api %s has a config this version cannot read; not routed: %s", api.name, e)
            continue
        taken: set[str] = set()
        servers = tuple(
            Server(_server_name(r.replica_id, taken), _server_address(r, local_socket), r.replica_id,
                   tls_ca=backend_ca if r.tls else None, host=r.host)
            for r in sorted(by_api[api.name], key=lambda r: r.replica_id)
        )
        routes.append(Route(
            api=api.name,
            servers=servers,
            concurrency=config.predictor.replica_concurrency,
            queue_length=config.replica_queue_length,
            request_timeout_s=config.predictor.request_timeout,
            grpc_prefix=grpc_path_prefix(api.name) if config.predictor.protobuf_path else None,
            reuse=keeps_connections(config.predictor),
        ))
    return routes


# -- rendering ------------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def _quoted(text: str) -> str:
    """A double-quoted haproxy argument (backslash and double quote escaped; no `$` expansion)."""
    assert "$" not in text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _literal(text: str) -> str:
    """Our own text inside a log-format string: no format characters, no quotes."""
    assert not set(text) & set("%'\"\\$")
    return text


def _json_body(kind: str, message: str) -> str:
    """A log-format JSON error body; `kind` and `message` are literal text or `%[...]` expressions.

    The request id is the client's own text, so it goes through haproxy's JSON escaping.
    """
    return _quoted(
        f'{{"kind": "{kind}", "message": "{message}", '
        '"request_id": "%[var(txn.request_id),json(utf8s)]"}'
    )


def _late(when_late: str, in_time: str) -> str:
    """A sample expression: `when_late` once the request is (about) past its deadline, else `in_time`.

    2.6 has no comparison converter, so (late + BIG) / BIG is >= 1 exactly when late >= 0.
    """
    return (f"%[date(0,ms),sub(txn.deadline_ms),add({_BIG + DEADLINE_SLACK_MS}),div({_BIG}),"
            f"iif('{_literal(when_late)}','{_literal(in_time)}')]")


# Consecutive requests to a splitter draw (n x SPREAD) mod 100 from its counter n: a step coprime
# with 100 visits every residue once in each 100 requests, so every 100 requests in a row give each
# API exactly its weight, spread through the hundred rather than in one run per API.
SPREAD = 37


def _loopback(bind: str) -> str:
    """Where the proxy reaches its own frontend (for a shadow's copy)."""
    host = bind.strip("[]")
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _split_rules(split: Split, bind: str, port: int, scheme: str = "http") -> list[str]:
    """The frontend rules of one TrafficSplitter: the draw, the shadow's copy, the path rewritten to
    the drawn API's (whose own `use_backend` rule then routes it, as a request to that API)."""
    at = f"{{ path /{split.name} /{split.name}/ }}"
    lines = [
        f"    http-request track-sc1 str({split.name}) table {SPLIT_TABLE} if {at}",
        f"    http-request set-var(txn.split) sc_inc_gpc0(1),mul({SPREAD}),mod({WEIGHT_TOTAL}) if {at}",
    ]
    if split.shadow is not None:
        api, percent = split.shadow
        copied = f"{at} {{ var(txn.shadow_draw) -m int lt {percent} }}"
        lines += [
            f"    http-request wait-for-body time {_ms(HEADERS_TIMEOUT_S)} if {at}",
            f"    http-request set-var(txn.shadow_draw) rand({WEIGHT_TOTAL}) if {at}",
            f"    http-request lua.sluice_shadow {scheme}://{format_address(_loopback(bind), port)} /{api} "
            f"{split.name} if {copied}",
            f"    http-request set-var(txn.shadowed) sc_inc_gpc1(1) if {copied}",
        ]
    upto = 0
    for api, weight in split.shares:
        upto += weight
        drawn = f"{at} {{ var(txn.split) -m int lt {upto} }}"
        lines += [
            f"    http-request track-sc2 str({split_key(split.name, api)}) table {SPLIT_TABLE} if {drawn}",
            f"    http-request set-path /{api} if {drawn}",
        ]
    return lines


def _bind(bind: str, port: int, tls: PublicTls | None) -> str:
    """The public port: plain HTTP (and h2c, told by its preface), or TLS with HTTP/2 and HTTP/1.1
    offered by ALPN. A plaintext request to a TLS port fails its handshake: it gets no answer."""
    line = f"    bind {format_address(bind, port)}"
    if tls is None:
        return line
    # The pair's digest is in the text (so in the configuration's tag): a renewed certificate is a
    # new configuration, and is served after a graceful reload.
    return f"{line} ssl crt {_quoted(tls.pem)} alpn h2,http/1.1  # certificate {tls.digest}"


def _frontend(routes: Sequence[Route], bind: str, port: int, splits: Sequence[Split] = (),
              tls: PublicTls | None = None) -> list[str]:
    scheme = "http" if tls is None else "https"
    lines = [
        "frontend public",
        _bind(bind, port, tls),
        # The deadline is the proxy's to set; a client's own is dropped.
        "    http-request del-header X-Sluice-Deadline-Ms",
        # How the client came in (the management API answers addresses in the same scheme); a
        # client's own claim is replaced.
        f"    http-request set-header X-Forwarded-Proto {scheme}",
        "    http-request set-header X-Request-ID %[uuid] unless { req.fhdr(x-request-id) -m len gt 0 }",
        "    http-request set-var(txn.request_id) req.fhdr(x-request-id)",
        # Count the realtime answers the proxy gave itself, by reason (sluice/proxy_rejections.py).
        *(f"    http-after-response set-var(txn.sluice_counted) sc_inc_gpc({index},0) "
          f"if {{ res.hdr(x-sluice-error) -m str {reason} }}" for reason, index in REASON_INDEX.items() if routes),
        # A replica backend's own 503 that turned out to be a timed-out wait becomes a 504.
        "    http-after-response set-status 504 if { res.hdr(x-sluice-error) -m str request_timeout }",
        "    http-after-response del-header X-Sluice-Error",
        "    http-after-response set-header X-Request-ID %[var(txn.request_id)]",
        "    http-error status 502 content-type application/json lf-string "
        + _json_body("bad_gateway", "the management API closed the connection or sent an invalid answer"),
        "    http-error status 503 content-type application/json lf-string "
        + _json_body("not_ready", "the management API cannot be reached"),
        "    http-error status 504 content-type application/json lf-string "
        + _json_body("request_timeout", f"the management API did not answer within {MANAGEMENT_TIMEOUT_S:g} s"),
    ]
    for split in splits:
        lines += _split_rules(split, bind, port, scheme)
    for route in routes:
        if route.grpc_prefix is not None:  # an h2c client is detected by its preface on the same bind
            lines.append(f"    use_backend {route.backend} if {{ path_beg {route.grpc_prefix} }}")
        else:
            lines.append(f"    use_backend {route.backend} if {{ path /{route.api} /{route.api}/ }}")
    lines.append("    default_backend management")
    return lines


def _verified_tls(ca: str, host: str) -> str:
    """A server line's TLS to a backend: its certificate checked against `ca`, its name against `host`."""
    return f" ssl verify required ca-file {_quoted(ca)} verifyhost {host.strip('[]')}"


def _management_backend(management: str, backend_ca: str = "@system-ca") -> list[str]:
    """`host:port`, or `https://host:port` for a management API serving TLS (checked against `backend_ca`)."""
    secure = management.startswith("https://")
    host, _, port = management.removeprefix("https://").rpartition(":")
    if not host or not port.isdigit() or not _valid_address(host, int(port)):
        raise ValueError(f"management address must be host:port or https://host:port (got {management!r})")
    return [
        "backend management",
        f"    timeout server {_ms(MANAGEMENT_TIMEOUT_S)}",
        f"    server management {format_address(host, int(port))}"
        + (_verified_tls(backend_ca, host) if secure else ""),
    ]


# gRPC status codes of the proxy's own answers to a gRPC API's calls (grpc/doc/statuscodes.md).
GRPC_UNAVAILABLE = 14
GRPC_UNAUTHENTICATED = 16


def _refusal(route: Route, status: int, kind: str, message: str, headers: str = "") -> str:
    """An `http-request return` answering the proxy's own refusal: JSON with `status` to an HTTP
    client; to a gRPC API's caller, gRPC's "trailers-only" answer (HTTP 200, `grpc-status`)."""
    if route.grpc_prefix is None:
        return (f"    http-request return status {status} content-type application/json lf-string "
                + _json_body(kind, message) + f"{headers} hdr X-Sluice-Error {kind}")
    code = GRPC_UNAUTHENTICATED if status == 401 else GRPC_UNAVAILABLE
    return (f"    http-request return status 200 content-type application/grpc hdr grpc-status {code} "
            f"hdr grpc-message {_quoted(_literal(message))} hdr X-Sluice-Error {kind}")


def _key_check(route: Route, keys_file: str) -> list[str]:
    """A realtime backend's key check: the `Authorization` value must be one of the file's lines.

    haproxy matches plain strings (a tree lookup), not in constant time as the management API's
    `hmac.compare_digest` does; the key is removed before the request reaches the predictor's code.
    A gRPC caller sends it as `authorization` metadata, which is the same header.
    """
    return [
        _refusal(route, 401, "unauthorized", "this API needs an API key: send Authorization: Bearer KEY",
                 " hdr WWW-Authenticate Bearer")
        + f" unless {{ req.fhdr(authorization) -m str -f {_quoted(keys_file)} }}",
        "    http-request del-header Authorization",
    ]


def _realtime_backend(route: Route, keys_file: str | None = None) -> list[str]:
    name = route.api
    if route.request_timeout_s is not None:
        wait_limit = run_limit = f"its request_timeout of {route.request_timeout_s:g} s"
    else:
        wait_limit, run_limit = f"{route.queue_timeout_s:g} s", f"{route.server_timeout_s:g} s"
    lines = [
        f"backend {route.backend}",
        "    balance leastconn",
        *([REUSE_LINE] if route.reuse else []),
        # A queued request whose client has gone is dropped, never started (2.6 reads this
        # option where the request came in, so the defaults section carries it too).
        "    option abortonclose",
        f"    timeout queue {_ms(route.queue_timeout_s)}",
        f"    timeout server {_ms(route.server_timeout_s)}",
        # Every request is tracked in the refusals table, so the frontend can count the answers the
        # proxy gives itself (the reason rides in X-Sluice-Error; see sluice/proxy_rejections.py).
        f"    http-request track-sc0 str({name}) table {TABLE}",
        # With protection on, a caller without a key learns nothing else (not even readiness).
        *(_key_check(route, keys_file) if keys_file else []),
        # Every server unusable (an address that does not resolve, one disabled by hand): say so
        # at once. Not `nbsrv eq 0`: an old worker finishing its keep-alive connections after a
        # reload counts no server at all in its stopped backends.
        _refusal(route, 503, "not_ready", _literal(f"no replica of {name} is ready")) + " if "
        + " ".join(f"!{{ srv_is_up({route.backend}/{s.name}) }}" for s in route.servers),
        # Every replica busy and the queue full: refuse at once; the client may retry shortly.
        _refusal(route, 503, "overloaded", _literal(f"{name} is at capacity: every replica is busy and its queue "
                                                    "is full"), " hdr Retry-After 1")
        + f" if {{ queue() ge {route.queue_limit} }} {{ be_conn_free eq 0 }}",
        f"    http-request set-var(txn.deadline_ms) date(0,ms),add({math.ceil(route.queue_timeout_s * 1000)})",
    ]
    if route.request_timeout_s is not None:
        lines.append("    http-request set-header X-Sluice-Deadline-Ms %[var(txn.deadline_ms)]")
    kind = _late("request_timeout", "not_ready")
    message = _late(f"no replica of {name} was free within {wait_limit}", f"no replica of {name} could be reached")
    lines += [
        # haproxy's own 503 here: the wait for a free replica timed out, or no replica answered.
        # The frontend turns the first into a 504 by the header.
        "    http-error status 503 content-type application/json lf-string "
        + _json_body(kind, message) + f" hdr X-Sluice-Error {_quoted(kind)}",
        "    http-error status 504 content-type application/json lf-string "
        + _json_body("request_timeout", _literal(f"{name} did not answer within {run_limit}"))
        + " hdr X-Sluice-Error request_timeout",
        "    http-error status 502 content-type application/json lf-string "
        + _json_body("bad_gateway", _literal(f"a replica of {name} closed the connection or sent an invalid answer"))
        + " hdr X-Sluice-Error bad_gateway",
    ]
    grpc = route.grpc_prefix is not None
    proto = " proto h2" if grpc else ""
    for server in route.servers:
        tls = ""
        if server.tls_ca is not None:  # a gRPC replica over TLS is offered HTTP/2 by ALPN, as gRPC wants
            tls = _verified_tls(server.tls_ca, server.host) + (" alpn h2" if grpc else "")
        lines.append(f"    server {server.name} {server.address} maxconn {route.concurrency}{proto}{tls}")
    return lines


def config_tag(body: str) -> str:
    """A short digest naming one configuration; the running worker reports it as its description."""
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def render_config(routes: Sequence[Route], *, bind: str, port: int, management: str,
                  keys_file: str | None = None, splits: Sequence[Split] = (), tls: PublicTls | None = None,
                  backend_ca: str = "@system-ca") -> str:
    """The whole haproxy.cfg; the same routes give the same text (so unchanged means no reload).

    `keys_file`: realtime APIs want `Authorization` to be one of this file's lines (see `_key_check`).
    `splits`: the TrafficSplitters, whose paths are shared among their APIs' paths.
    `tls`: the public port serves TLS with this certificate; its digest is in the text, so a
    certificate renewed on disk changes the configuration (and is served after a graceful reload).
    `backend_ca`: what an `https://` management API's certificate is checked against.
    """
    longest = max([MANAGEMENT_TIMEOUT_S] + [r.queue_timeout_s + r.server_timeout_s for r in routes])
    sections = [
        [
            "defaults",
            "    mode http",
            "    option forwardfor",
            "    option abortonclose",
            # On a reload the old worker answers the next request of an idle keep-alive connection
            # (with `Connection: close`) rather than closing it under a client that may be sending.
            "    option idle-close-on-response",
            f"    timeout connect {_ms(CONNECT_TIMEOUT_S)}",
            f"    timeout client {_ms(CLIENT_TIMEOUT_S)}",
            f"    timeout http-request {_ms(HEADERS_TIMEOUT_S)}",
            f"    timeout http-keep-alive {_ms(KEEP_ALIVE_TIMEOUT_S)}",
            f"    timeout server {_ms(MANAGEMENT_TIMEOUT_S)}",
            f"    timeout queue {_ms(DEFAULT_QUEUE_TIMEOUT_S)}",
            # A replica that refuses connections (it just died) is retried on another one.
            "    retries 2",
            "    option redispatch 1",
            # A replica host name that does not resolve disables that server, not the whole config.
            "    default-server init-addr libc,none",
        ],
        _frontend(routes, bind, port, splits, tls),
        _management_backend(management, backend_ca),
        *([[f"backend {TABLE}", f"    stick-table type string len 128 size 10k store gpc({len(REASON_INDEX)})"]]
          if routes else []),
        # Per splitter: gpc0 its draw counter, gpc1 its copies to the shadow; per splitter/api: requests sent.
        *([[f"backend {SPLIT_TABLE}", "    stick-table type string len 128 size 10k store gpc0,gpc1,http_req_cnt"]]
          if splits else []),
        *(_realtime_backend(route, keys_file) for route in routes),
    ]
    body = "\n\n".join("\n".join(section) for section in sections) + "\n"
    head = [
        "# Written by the Sluice proxy controller (sluice/proxy.py); edits are overwritten.",
        "global",
        f"    description sluice-{config_tag(body)}",
        f"    hard-stop-after {math.ceil(longest + HARD_STOP_MARGIN_S)}s",
        # One thread: measured on 2 cores, a second haproxy thread competed with the replicas
        # for CPU (iris, 8 clients: 0.50x -> 0.69x a bare gunicorn's requests/s); one thread
        # carries thousands of requests per second on loopback.
        "    nbthread 1",
    ]
    if tls is not None:
        head += [
            "    ssl-default-bind-options ssl-min-ver TLSv1.2 no-tls-tickets",
            f"    ssl-default-bind-ciphers {TLS_CIPHERS}",
            f"    ssl-default-bind-ciphersuites {TLS_CIPHERSUITES}",
        ]
    if any(split.shadow is not None for split in splits):
        head.append(f"    lua-load {_quoted(str(SHADOW_LUA))}")
        if tls is not None:  # a shadow's copy goes to this proxy's own port, on loopback
            head.append("    httpclient.ssl.verify none")
    return "\n".join(head) + "\n\n" + body


def tag_of(config: str) -> str:
    """The tag `render_config` wrote into a configuration ("" if none)."""
    match = re.search(r"^\s*description sluice-([0-9a-f]+)\s*$", config, re.MULTILINE)
    return match.group(1) if match else ""
