"""Sluice's public entry point: a real haproxy, and the controller that keeps its routes current.

haproxy runs in master-worker mode (`-W`) with its master CLI on a UNIX socket in a state folder.
Every ~0.3 s the controller renders the configuration from the registry and the routable
replicas (`sluice/proxy_config.py`); when it changed, it writes it atomically (after
`haproxy -c` accepted it) and sends SIGUSR2 to the master, which re-executes itself and starts a
new worker on the same listening sockets (in 2.6's master-worker mode the master hands them over
itself, no `expose-fd listeners` needed, so no connection is refused), while the old worker
finishes what it holds and leaves: it answers the next request of each idle keep-alive
connection with `Connection: close` rather than closing under a client that may be sending
(`option idle-close-on-response`), so it may linger up to `timeout http-keep-alive`.

Launchers stop a draining replica only once no proxy routes to it any more, so each controller
publishes in Redis (`sluice:proxies`) the replicas its configuration routes and whether haproxy
has settled on it (the running worker serves that configuration and no older worker is left);
`unrouted()` is the launchers' side of that contract.

Every turn it also samples each routed API's requests in flight (its backend's sessions, in
every haproxy worker) and once a second publishes the running totals beat's scaler reads
(`foundation/proxy_load.py`). Like the routing record, they are written through Redis and a
failed write only costs this turn: haproxy keeps routing.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import redis

from foundation.api_keys import KEYS_VARIABLE, PROTECT_REALTIME_VARIABLE, header_values, refuse_open_bind
from foundation.api_registry import ApiRegistry, RedisApiRegistry
from foundation.errors import ConfigError, NotReady
from foundation.figure_store import RedisFigureStore
from foundation.figures import REALTIME_REJECTED, REALTIME_REQUESTS, SPLIT_REQUESTS, Recorder
from foundation.proxy_load import PUBLISH_EVERY_S, LoadTally, ProxyLoadBook, RedisProxyLoadBook
from foundation.proxy_registry import FORGET_PROXIES_AFTER_S, ProxyRecord, ProxyRegistry, RedisProxyRegistry
from foundation.replica_directory import REPLICA_TTL_S, RedisReplicaDirectory, ReplicaDirectory
from foundation.settings import Settings

from .haproxy import HAProxy, HAProxyState
from .local_socket import reachable_socket
from .proxy_config import (
    PublicTls,
    Route,
    Split,
    format_address,
    in_flight_by_api,
    plan_routes,
    plan_splits,
    render_config,
    tag_of,
)
from .proxy_rejections import REASONS, TABLE, RejectionTally, parse_table
from .proxy_splits import SPLIT_TABLE, SplitTally, parse_split_table
from .tls.served import ServedCertificate

log = logging.getLogger(__name__)
T = TypeVar("T")

STEP_INTERVAL_S = 0.3
# A reload the master has not finished within this long is sent again.
RELOAD_PATIENCE_S = 10.0
# A haproxy that died is started again at most this often.
RESTART_DELAY_S = 1.0
# Replica records silent this long are dropped (their host died without deregistering), this often.
FORGET_EVERY_S = 30.0


# -- judging replicas silent ------------------------------------------------------------------------
@dataclass
class SilenceAllowance:
    """How long a replica may stay silent before the proxy stops routing to it: `REPLICA_TTL_S` of
    time in which Redis answered, not of wall-clock time.

    While the controller cannot read Redis (restarted, or a failover between a killed primary and
    its promoted replica), no launcher can announce its replica either, and haproxy keeps routing
    the last configuration. Once Redis answers again, every record is as old as the outage: judged
    by the clock alone, each replica would look gone and be dropped until its launcher's next
    heartbeat, and requests in that gap would be refused. So the span in which Redis could not be
    read is added to the allowance, until one TTL after Redis answered again: time enough for every
    live launcher to be heard from. A replica that really died is dropped that much later.
    """

    ttl_s: float = REPLICA_TTL_S
    _last_read: float | None = None      # the last turn that read Redis
    _unread_since: float | None = None   # the last read before the turns that failed, while they fail
    _credit_s: float = 0.0               # the span added to `ttl_s` ...
    _credit_until: float = 0.0           # ... until then

    def ttl_at(self, now: float) -> float:
        """The allowance for a read at `now` (when it succeeds; `failed` or `read` says which)."""
        if self._unread_since is not None:
            self._credit_s, self._credit_until = now - self._unread_since, now + self.ttl_s
        return self.ttl_s + (self._credit_s if now < self._credit_until else 0.0)

    def read(self, now: float) -> None:
        self._last_read, self._unread_since = now, None

    def failed(self, now: float) -> None:
        if self._unread_since is None:
            self._unread_since = now if self._last_read is None else self._last_read


# -- the controller -------------------------------------------------------------------------------
@dataclass
class _Reload:
    """A SIGUSR2 sent; over once the master counts one more reload (done or failed)."""

    sent_at: float
    reloads_before: int
    failed_before: int
    reported: bool = False


@dataclass
class ProxyController:
    """Keeps one haproxy serving the current routes; `step(now)` is one turn of its loop.

    It reads the API registry and the replica directory, counts its refusals with `recorder`, and
    publishes its own routing state (`sluice:proxies`), all through `redis_client` unless given
    others (a test's fakes: `foundation.memory`).
    """

    redis_client: redis.Redis
    port: int
    management: str                   # host:port of the management API
    bind: str = "127.0.0.1"
    state_dir: Path | None = None
    proxy_id: str | None = None
    executable: str | None = None
    forget_every_s: float = FORGET_EVERY_S
    # API keys and whether realtime APIs want them (default: Settings.from_env()).
    settings: Settings | None = None
    registry: ApiRegistry | None = None
    replicas: ReplicaDirectory | None = None
    recorder: Recorder | None = None
    loads: ProxyLoadBook | None = None  # where it publishes its in-flight totals
    # TLS on the public port: the certificate chain and its key (both or neither; see sluice/tls/served.py).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # What a backend serving TLS (a replica of a host with a certificate, an https:// management API)
    # is checked against: a CA file, or haproxy's `@system-ca` (sluice/tls/hosts.py).
    backend_ca: str = "@system-ca"
    restarts: int = 0
    reloads: int = 0
    _haproxy: HAProxy | None = None
    _own_state_dir: bool = False
    _config: str = ""
    _rejected: str = ""
    _routes: list[Route] = field(default_factory=list)
    _pending: _Reload | None = None
    _started_at: float = 0.0
    _last_forget: float = 0.0
    _settled: bool = False
    _stopping: bool = False
    _tally: RejectionTally = field(default_factory=RejectionTally)
    _splits: list[Split] = field(default_factory=list)
    _split_tally: SplitTally = field(default_factory=SplitTally)
    _figures: Recorder | None = None
    _silence: SilenceAllowance = field(default_factory=SilenceAllowance)
    _load: LoadTally = field(default_factory=LoadTally)
    _load_published: float = 0.0

    def __post_init__(self) -> None:
        if self.state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="sluice-proxy-"))
            self._own_state_dir = True
        self.state_dir = Path(self.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.proxy_id = self.proxy_id or f"{socket.gethostname()}:{self.port}"
        self.settings = self.settings or Settings.from_env()
        self._registry: ApiRegistry = self.registry or RedisApiRegistry(self.redis_client)
        self._replicas: ReplicaDirectory = self.replicas or RedisReplicaDirectory(self.redis_client)
        self._haproxy = HAProxy(self.state_dir, self.executable)
        self._figures = self.recorder or Recorder(RedisFigureStore(self.redis_client))
        self._loads: ProxyLoadBook = self.loads or RedisProxyLoadBook(self.redis_client)
        self._proxies: ProxyRegistry = RedisProxyRegistry(self.redis_client)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS at the public address needs both a certificate and its key "
                              "(--tls-cert and --tls-key, or SLUICE_TLS_CERT and SLUICE_TLS_KEY)")
        self._tls: ServedCertificate | None = None
        if self.tls_cert is not None and self.tls_key is not None:
            self._tls = ServedCertificate(Path(self.tls_cert), Path(self.tls_key), self.state_dir)

    @property
    def haproxy(self) -> HAProxy:
        assert self._haproxy is not None
        return self._haproxy

    @property
    def url(self) -> str:
        host = self.bind if self.bind not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"{'https' if self._tls is not None else 'http'}://{format_address(host, self.port)}"

    @property
    def routes(self) -> list[Route]:
        return list(self._routes)

    @property
    def config_tag(self) -> str:
        """The tag of the latest configuration written (what a settled haproxy runs)."""
        return tag_of(self._config)

    @property
    def settled(self) -> bool:
        """haproxy runs the latest configuration and no worker of an older one is left."""
        return self._settled

    # rendering
    @property
    def keys_file(self) -> Path | None:
        """The accepted `Authorization` values, one a line, when realtime APIs are protected."""
        assert self.settings is not None and self.state_dir is not None
        return self.state_dir / "realtime-keys.lst" if self.settings.protect_realtime else None

    def _write_keys_file(self) -> None:
        """Written once at start (keys are read once per process), readable by this user only."""
        path = self.keys_file
        if path is None:
            return
        assert self.settings is not None
        staging = path.with_name(path.name + ".tmp")
        staging.unlink(missing_ok=True)
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(f"{value}\n" for value in header_values(self.settings.api_keys)))
        os.replace(staging, path)

    def _render(self, now: float) -> tuple[str, list[Route]]:
        try:
            apis, replicas = self._registry.all(), self._replicas.routable(now, ttl_s=self._silence.ttl_at(now))
        except redis.RedisError:
            self._silence.failed(now)
            raise
        self._silence.read(now)
        routes = plan_routes(apis, replicas, local_socket=lambda r: reachable_socket(r.socket, r.host_id),
                             backend_ca=self.backend_ca)
        self._splits = plan_splits(apis)
        keys_file = str(self.keys_file) if self.keys_file is not None else None
        tls = None
        if self._tls is not None:
            self._tls.refresh()
            tls = PublicTls(str(self._tls.combined), self._tls.digest)
        return render_config(routes, bind=self.bind, port=self.port, management=self.management,
                             keys_file=keys_file, splits=self._splits, tls=tls, backend_ca=self.backend_ca), routes

    def _apply(self, text: str, routes: list[Route]) -> None:
        self.haproxy.check(text)
        self.haproxy.write(text)
        self._settled = False  # until haproxy is seen running it
        self._config, self._routes = text, routes

    # lifecycle
    def start(self, now: float | None = None, timeout: float = 15.0) -> ProxyController:
        """Start haproxy on the current routes and wait until it serves them."""
        now = time.time() if now is None else now
        assert self.settings is not None
        refuse_open_bind(self.bind, self.settings, what="the proxy")
        if self.settings.protect_realtime and not self.settings.api_keys:
            raise ConfigError(f"{PROTECT_REALTIME_VARIABLE}=1 needs API keys: set {KEYS_VARIABLE} "
                              "(or SLUICE_API_KEYS_FILE)")
        self._write_keys_file()
        if self._tls is not None:
            self._tls.load()  # a pair that cannot be served fails the start, naming the file
        assert self._figures is not None
        self._figures.start()
        text, routes = self._render(now)
        self._apply(text, routes)
        self._start_haproxy(now)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.haproxy.alive():
                raise NotReady(f"haproxy exited at start:\n{self.haproxy.log_tail()}")
            state = self.haproxy.state()
            if state is not None and state.tag == tag_of(self._config):
                self._publish(time.time(), state)
                return self
            time.sleep(0.05)
        self.haproxy.stop(grace=0)
        raise NotReady(f"haproxy did not start within {timeout:.0f}s:\n{self.haproxy.log_tail()}")

    def _start_haproxy(self, now: float) -> None:
        self.haproxy.start()
        self._started_at = now
        self._pending = None

    def step(self, now: float) -> bool:
        """Render, and when the routes changed write the configuration and reload haproxy; restart a
        haproxy that died; publish what it routes. True when a new configuration was written."""
        if self._stopping:
            return False
        changed = False
        text, routes = self._render(now)
        if text != self._config and text != self._rejected:
            try:
                self._apply(text, routes)
                changed = True
            except NotReady as e:  # keep serving the last good configuration
                self._rejected = text
                log.error("proxy: %s", e)
        if not self.haproxy.alive():
            if now - self._started_at >= RESTART_DELAY_S:
                code = self.haproxy.process.returncode if self.haproxy.process is not None else None
                log.warning("proxy: haproxy exited (%s); starting it again\n%s", code, self.haproxy.log_tail(10))
                self._start_haproxy(now)
                self.restarts += 1
            self._settled = False
            self._publish(now, None)
            return changed
        state = self.haproxy.state()
        wanted = tag_of(self._config)
        if state is not None and state.tag != wanted and self._may_reload(state, now):
            self.haproxy.reload()
            self.reloads += 1
            self._pending = _Reload(now, state.reloads, state.failed)
        self._publish(now, state)
        if state is not None:
            self._count_rejections(state)
            self._count_splits(state)
            self._sample_load(state, now)
        if now - self._last_forget >= self.forget_every_s:
            self._last_forget = now
            self._replicas.forget_silent(now)
            self._forget_silent_proxies(now)
            self._loads.forget_silent(now, FORGET_PROXIES_AFTER_S)
        return changed

    def _may_reload(self, state: HAProxyState, now: float) -> bool:
        """One reload at a time (a SIGUSR2 reaching a master still re-executing could kill it); after
        a failed one (the master keeps serving the previous configuration), wait before trying again."""
        pending = self._pending
        if pending is None:
            return True
        finished = state.reloads > pending.reloads_before
        failed = finished and state.failed > pending.failed_before
        if failed and not pending.reported:
            pending.reported = True
            log.error("proxy: haproxy could not reload; still on the previous configuration\n%s",
                      self.haproxy.log_tail(10))
        if finished and not failed:
            return True
        return now - pending.sent_at >= RELOAD_PATIENCE_S

    def _tables(self, state: HAProxyState, table: str, parse: Callable[[str], T]) -> dict[int, T]:
        """Every haproxy worker's stick table `table`, parsed, by pid (a worker gone meanwhile, or a
        master busy, is read again next turn)."""
        readings: dict[int, T] = {}
        for pid in (*state.workers, *state.old_workers):
            try:
                readings[pid] = parse(self.haproxy.command(f"@!{pid} show table {table}"))
            except OSError:
                continue
        return readings

    def _count_rejections(self, state: HAProxyState) -> None:
        """Add what haproxy answered itself since the last turn to the figures (sluice/proxy_rejections.py)."""
        readings = self._tables(state, TABLE, parse_table)
        self._tally.forget_except({*state.workers, *state.old_workers})
        codes = dict(REASONS)
        assert self._figures is not None
        for (api, reason), n in self._tally.update(readings).items():
            self._figures.counter(REALTIME_REJECTED, api, reason).inc(n)
            self._figures.counter(REALTIME_REQUESTS, api, str(codes[reason])).inc(n)

    def _count_splits(self, state: HAProxyState) -> None:
        """Add what each TrafficSplitter sent to each of its APIs since the last turn to the figures
        (sluice/proxy_splits.py)."""
        if not self._splits and not self._split_tally.following:
            return
        readings = self._tables(state, SPLIT_TABLE, parse_split_table)
        self._split_tally.forget_except({*state.workers, *state.old_workers})
        shadows = {split.name: split.shadow[0] for split in self._splits if split.shadow is not None}
        assert self._figures is not None
        for (splitter, api), n in self._split_tally.update(readings, shadows).items():
            self._figures.counter(SPLIT_REQUESTS, splitter, api).inc(n)

    def _sample_load(self, state: HAProxyState, now: float) -> None:
        """One sample of each routed API's requests in flight here, added to the totals beat's scaler
        reads (`foundation/proxy_load.py`), which are published once a second.

        A reload's old worker still holds requests of its own, so every worker is read. A sample
        missing a worker would read low: when one cannot be read, this turn takes none.
        """
        in_flight = dict.fromkeys((route.api for route in self._routes), 0)
        for pid in (*state.workers, *state.old_workers):
            try:
                rows = self.haproxy.stats(pid)
            except OSError:
                return
            for api, n in in_flight_by_api(rows).items():
                in_flight[api] = in_flight.get(api, 0) + n
        self._load.add(in_flight)
        if now - self._load_published >= PUBLISH_EVERY_S:
            self._loads.publish(self._load.record(self.proxy_id or "", now))
            self._load_published = now

    def _publish(self, now: float, state: HAProxyState | None) -> None:
        self._settled = bool(state is not None and state.tag == tag_of(self._config) and not state.old_workers)
        self._proxies.publish(ProxyRecord(
            proxy_id=self.proxy_id or "",
            routes=[rid for route in self._routes for rid in route.replica_ids],
            settled=self._settled,
            seen=now,
            config=tag_of(self._config),
            listen=f"{self.bind}:{self.port}",
            pid=os.getpid(),
        ))

    def _forget_silent_proxies(self, now: float) -> None:
        self._proxies.forget_silent(now)

    def run(self, stop: threading.Event, interval: float = STEP_INTERVAL_S) -> None:
        """Step until `stop` is set; a failed turn (Redis away) is logged, haproxy keeps serving."""
        while not stop.is_set():
            try:
                self.step(time.time())
            except (redis.RedisError, OSError) as e:
                log.warning("proxy: %s: %s", type(e).__name__, e)
            stop.wait(interval)

    def stop(self, grace: float = 10.0) -> None:
        """Stop haproxy (in-flight requests finish within `grace`) and withdraw this proxy's record."""
        self._stopping = True
        state = self.haproxy.state()
        if state is not None:  # what haproxy answered since the last turn, before its counters go
            self._count_rejections(state)
            self._count_splits(state)
        self.haproxy.stop(grace)
        if self._figures is not None:
            self._figures.close()
        self.haproxy.close()
        try:
            self._proxies.withdraw(self.proxy_id or "")
            self._loads.withdraw(self.proxy_id or "")
        except redis.RedisError as e:
            log.warning("proxy: could not withdraw its record: %s", e)
        if self._own_state_dir and self.state_dir is not None and not os.environ.get("SLUICE_KEEP_DATA"):
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> ProxyController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
