"""Every Redis client a Sluice process uses, built in one place, by named policy.

A policy says how long a client waits for Redis and what it does when Redis does not answer;
`client(where, policy)` is the one function that builds a `redis.Redis`, for a URL or for the
primary that Redis Sentinel names (`Settings.redis_address`). Every connection gets a socket
timeout, a connect timeout and TCP keepalive, so that a Redis that went away (a dead host, a
dropped NAT entry) is noticed instead of waited on.

With sentinels, a client is redis-py's `Sentinel.master_for`: each new connection asks the
sentinels for the primary, and a connection to a server that is no longer the primary (it died,
or was demoted and answers READONLY) is dropped, so the store's retry below sends the command
again to whichever server the sentinels promoted. The job store's Lua scripts are redis-py
`Script`s, which load themselves again on the promoted server's NOSCRIPT.

- `STORE` (`store_client`): the job store and the API's services. Rides out Redis stalls and
  restarts: a command is sent again, with backoff, for up to `Settings.redis_retry_s`
  (`SLUICE_REDIS_RETRY_S`), see `RideOut` below.
- `HEARTBEAT` (`heartbeat_client`): registries and heartbeats of processes that loop (replica
  launchers and their manager, the proxy controller, the embedded stack's probes). Short
  timeouts, a health check of an idle connection, no retries: the next turn of the loop is the
  retry, and a stalled Redis must not stall the loop (a replica keeps serving meanwhile).
- `BACKGROUND` (`background_client`): flushes from a thread of their own (figures, log lines).
  Shorter timeouts still and no retries: a failed flush is kept (figures) or told once (log
  lines), and exit is never held up for long.

Why riding out is right for the store: redis-py's client, as `Redis.from_url` builds it, gives
up after one socket timeout and does not retry. But a Redis that stalls (a slow fork, a paused
VM or container, SIGSTOP) still runs every command it was sent once it wakes up: a timeout loses
the *reply*, not the write. A Redis that restarts on its append-only file loses nothing it
acknowledged, only the connections. Either way the caller's best move is to send the command
again until Redis answers, for a bounded time.

That is only safe because every command Sluice sends through the store's client may run twice:
plain writes are idempotent (HSET, SADD, EXPIRE), and the job store's scripts carry a token per
call so that a repeat of a call that already ran answers what the first run answered
(`jobs/store/`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import SSLConnection
from redis.exceptions import AuthorizationError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelManagedConnection

from foundation.errors import NotReady, SluiceError
from foundation.settings import RedisAddress

if TYPE_CHECKING:
    from foundation.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors after which a command may succeed if sent again: the connection broke, or no reply came
# in time, or Redis is still loading its data after a restart (BusyLoadingError is a ConnectionError),
# or the server was the primary and is a replica now (READONLY: a failover demoted it; through
# sentinels redis-py turns that into a ConnectionError, through a plain URL an address that moves to
# the new primary answers again once it has).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, TimeoutError, redis.ReadOnlyError,
)
# ConnectionErrors that sending again cannot cure.
_PERMANENT_ERRORS: tuple[type[Exception], ...] = (redis.AuthenticationError, AuthorizationError)

FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0


class RedisUnavailable(NotReady, redis.ConnectionError):
    """Redis did not answer for the whole retry window (still a `redis.ConnectionError` to callers that catch those)."""


def one_line(error: BaseException) -> str:
    """What went wrong, in one line: the message a job status or a log line should carry."""
    if isinstance(error, SluiceError):
        text = error.message
    elif isinstance(error, redis.RedisError):
        text = f"Redis failed: {type(error).__name__}: {error}"
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return " ".join(text.split())


_STOPPING = threading.Event()


def stop_riding_out() -> None:
    """This process is stopping (a worker node's warm shutdown): a call riding out Redis's absence gives
    up at its next try, and `riding_out_stopped()` says so to whoever waits beyond it."""
    _STOPPING.set()


def riding_out_stopped() -> bool:
    """Whether `stop_riding_out` was called in this process."""
    return _STOPPING.is_set()


class RideOut(Retry):
    """redis-py's retry policy, bounded by time instead of by a count.

    Sends a command again, with exponential backoff, until `within_s` has passed since the call
    began; then raises `RedisUnavailable` from the last error. Each attempt can itself last up to
    the socket timeout, so a stalled Redis is asked about every socket timeout, and a stopped one
    (connection refused) every `MAX_DELAY_S` at most.
    """

    def __init__(
        self, within_s: float, first_delay_s: float = FIRST_DELAY_S, max_delay_s: float = MAX_DELAY_S,
        sleep: Callable[[float], Any] = time.sleep, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ExponentialBackoff(cap=max_delay_s, base=first_delay_s / 2), retries=-1,
                         supported_errors=TRANSIENT_ERRORS)
        self.within_s = within_s
        self._sleep = sleep
        self._clock = clock

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RideOut) and self.within_s == other.within_s and super().__eq__(other)

    __hash__ = Retry.__hash__

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        """Same contract as `Retry.call_with_retry`; local state only, so nested calls (a connect
        inside a command) are safe."""
        deadline = self._clock() + self.within_s
        failures = 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if isinstance(error, _PERMANENT_ERRORS) or (is_retryable and not is_retryable(error)):
                    raise
                failures += 1
                if with_failure_count:
                    fail(error, failures)
                else:
                    fail(error)
                if isinstance(error, RedisUnavailable):  # a nested call already used up the window
                    raise
                delay = self._backoff.compute(failures)
                if _STOPPING.is_set():
                    raise RedisUnavailable(
                        f"Redis did not answer, and this process is stopping ({type(error).__name__}: {error})"
                    ) from error
                if self._clock() + delay >= deadline:
                    raise RedisUnavailable(
                        f"Redis did not answer for {self.within_s:g} s ({type(error).__name__}: {error})"
                    ) from error
                if failures == 1:
                    log.warning("Redis did not answer (%s: %s); retrying for up to %g s",
                                type(error).__name__, error, self.within_s)
                self._sleep(delay)


# -- policies --------------------------------------------------------------------------------------
def _keepalive_options() -> dict[int, int]:
    """Probe an idle connection after 30 s, every 5 s, 3 times: a vanished peer is noticed in about 45 s
    (the kernel's own default waits two hours). Only the options this platform has."""
    # TCP_KEEPALIVE is macOS's name for Linux's TCP_KEEPIDLE.
    wanted = {"TCP_KEEPIDLE": 30, "TCP_KEEPALIVE": 30, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


KEEPALIVE_OPTIONS = _keepalive_options()


@dataclass(frozen=True)
class ClientPolicy:
    """How one kind of client talks to Redis: how long it waits, and whether it sends a command again."""

    name: str
    socket_timeout_s: float          # longest wait for a reply (and, with `connect_timeout_s`, for a connection)
    connect_timeout_s: float
    retry_s: float = 0.0             # > 0: ride out failures for this long (`RideOut`); 0: send once
    health_check_interval_s: int = 0  # PING a connection idle this long before using it again; 0: never

    def riding_out(self, retry_s: float) -> ClientPolicy:
        """This policy with a retry window of `retry_s` (a deployment's `Settings.redis_retry_s`)."""
        return replace(self, retry_s=retry_s)


STORE = ClientPolicy("store", socket_timeout_s=5.0, connect_timeout_s=5.0, retry_s=30.0, health_check_interval_s=30)
HEARTBEAT = ClientPolicy("heartbeat", socket_timeout_s=5.0, connect_timeout_s=5.0, health_check_interval_s=30)
BACKGROUND = ClientPolicy("background", socket_timeout_s=2.0, connect_timeout_s=2.0)


def socket_options(policy: ClientPolicy) -> dict[str, Any]:
    """The socket timeouts and keepalive of `policy`, as redis-py's keyword arguments."""
    return {
        "socket_timeout": policy.socket_timeout_s,
        "socket_connect_timeout": policy.connect_timeout_s,
        "socket_keepalive": True,
        "socket_keepalive_options": KEEPALIVE_OPTIONS,
    }


class FollowingPrimaryConnection(SentinelManagedConnection):
    """A connection to the primary the sentinels name, asked again at every (re)connect.

    redis-py asks the sentinels only when a connection is taken from the pool (`connect`); a
    command that is retried after its connection dropped reconnects through `connect_check_health`
    to the address it had (redis-py#3874). With `RideOut` that means dialling the dead primary for
    the whole retry window while the promoted replica waits: a node recording a batch stalled
    30 s after a failover. Here every connect looks the primary up first, so each retry reaches
    the current one; the retry itself stays the command's (`RideOut`), not the socket's.
    """

    def connect_check_health(self, check_health: bool = True, retry_socket_connect: bool = True) -> None:
        if self._sock:
            return
        if self.connection_pool.is_master:
            self.host, self.port = self.connection_pool.get_master_address()
        super().connect_check_health(check_health=check_health, retry_socket_connect=False)


class FollowingPrimarySSLConnection(FollowingPrimaryConnection, SSLConnection):
    """The same over TLS (`SLUICE_REDIS_TLS=1` with sentinels)."""


def client(where: str | RedisAddress, policy: ClientPolicy, **options: Any) -> redis.Redis:
    """A client for `where` (a URL, or `Settings.redis_address`) that behaves as `policy` says: the
    one place a Sluice process builds one.

    `options` are redis-py's own, over the policy's (a test's shorter socket timeout, say).
    Nothing connects until the first command.
    """
    address = RedisAddress(url=where) if isinstance(where, str) else where
    settings: dict[str, Any] = {
        **socket_options(policy),
        "health_check_interval": policy.health_check_interval_s,
        "retry": RideOut(policy.retry_s) if policy.retry_s > 0 else Retry(NoBackoff(), 0),
    }
    if address.password is not None:
        settings["password"] = address.password  # a password in the URL wins over this one
    tls = address.tls.redis_py() if address.tls is not None else {}
    settings.update(tls)  # a rediss:// URL's SSL connection, or the sentinels' primary over TLS
    settings.update(options)
    if not address.sentinels:
        return redis.Redis.from_url(address.url, **settings)
    # The sentinels are asked with the same timeouts and keepalive (a vanished sentinel is skipped
    # for the next), without retries: redis-py asks each in turn, and the command's retry asks again.
    sentinel_settings: dict[str, Any] = {**socket_options(policy), "password": address.sentinel_password,
                                         **({"ssl": True, **tls} if tls else {})}
    sentinels = Sentinel(list(address.sentinels), sentinel_kwargs=sentinel_settings, **settings)
    connection = FollowingPrimarySSLConnection if tls else FollowingPrimaryConnection
    primary: redis.Redis = sentinels.master_for(address.master, connection_class=connection)
    return primary


def store_client(settings: Settings) -> redis.Redis:
    """The job store's client (and the API's): rides out stalls for `settings.redis_retry_s`."""
    return client(settings.redis_address, STORE.riding_out(settings.redis_retry_s))


def heartbeat_client(settings: Settings) -> redis.Redis:
    """A looping process's client for registries and heartbeats: short timeouts, no retries."""
    return client(settings.redis_address, HEARTBEAT)


def background_client(settings: Settings) -> redis.Redis:
    """A flusher thread's client (figures, log lines): shorter timeouts still, no retries."""
    return client(settings.redis_address, BACKGROUND)


def connect(where: str | RedisAddress, retry_s: float, **options: Any) -> redis.Redis:
    """The store's client for `where` whose every command rides out Redis failures for up to `retry_s`
    seconds (`store_client` builds the same from settings)."""
    return client(where, STORE.riding_out(retry_s), **options)


def text(raw: object) -> str:
    """A reply as text: Sluice's clients answer bytes (a client made with `decode_responses` str)."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
