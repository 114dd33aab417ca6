"""API keys: who may call Sluice.

A deploy uploads a program that every worker runs, so an open management API runs anyone's code.
With keys configured (`SLUICE_API_KEYS`, comma-separated, and/or `SLUICE_API_KEYS_FILE`, one key
a line) every management endpoint but `/healthz` wants `Authorization: Bearer <key>`; the proxy
asks the same of realtime APIs when `SLUICE_PROTECT_REALTIME=1`. Without keys Sluice is open, but
then, like Redis's protected mode, `sluice proxy` (the public entry) refuses to listen on anything
but loopback unless the operator says `SLUICE_ALLOW_ANONYMOUS=1`.

Nothing here reads the environment at import; `load_api_keys` is called once by
`Settings.from_env`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from flask import Response, request

from predictors_runtime.errors import ConfigError, InsecureBind, Unauthorized

from .errors import error_response

if TYPE_CHECKING:
    from jobs.settings import Settings

KEYS_VARIABLE = "SLUICE_API_KEYS"
KEYS_FILE_VARIABLE = "SLUICE_API_KEYS_FILE"
CLIENT_KEY_VARIABLE = "SLUICE_API_KEY"
ALLOW_ANONYMOUS_VARIABLE = "SLUICE_ALLOW_ANONYMOUS"
PROTECT_REALTIME_VARIABLE = "SLUICE_PROTECT_REALTIME"
# Endpoints a load balancer or orchestrator probes without credentials.
OPEN_PATHS = frozenset({"/healthz"})
# Visible ASCII but the comma (the separator of SLUICE_API_KEYS): a key travels in an HTTP
# header and in haproxy's pattern file, where whitespace or control characters would change it.
_KEY_RE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_SCHEME = "bearer"


def _checked(key: str, source: str) -> str:
    if not _KEY_RE.fullmatch(key):
        raise ConfigError(f"{source}: an API key must be printable ASCII without spaces or commas")
    return key


def parse_keys_file(text: str, source: str = KEYS_FILE_VARIABLE) -> tuple[str, ...]:
    """One key a line; blank lines and `#` comments are skipped, surrounding spaces dropped."""
    keys = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(_checked(line, source))
    return tuple(keys)


def load_api_keys(env: Mapping[str, str]) -> tuple[str, ...]:
    """The keys of `SLUICE_API_KEYS` and of the file `SLUICE_API_KEYS_FILE` names, in that order,
    without repeats. An unreadable keys file is an error: starting open would be a silent downgrade."""
    keys = [_checked(k.strip(), KEYS_VARIABLE) for k in (env.get(KEYS_VARIABLE) or "").split(",") if k.strip()]
    path = env.get(KEYS_FILE_VARIABLE)
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{KEYS_FILE_VARIABLE}: cannot read {path}: {e}") from e
        keys += parse_keys_file(text)
    return tuple(dict.fromkeys(keys))


def flag(env: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: 1, true, yes, on (any case) mean yes."""
    return (env.get(name) or "").strip().lower() in {"1", "true", "yes", "on"}


def presented_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme in any case), else None."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    return key if scheme.lower() == _SCHEME and key else None


def key_matches(presented: str, keys: Iterable[str]) -> bool:
    """Compared in constant time with every key (no early exit), so timing tells nothing of which
    key, or how much of one, matched; digests of equal length, so not even the keys' lengths."""
    given = hashlib.sha256(presented.encode()).digest()
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, hashlib.sha256(key.encode()).digest())
    return found


def authenticate(authorization: str | None, keys: Iterable[str]) -> None:
    """Raise Unauthorized unless `authorization` carries one of `keys`."""
    key = presented_key(authorization)
    if key is None:
        raise Unauthorized("this endpoint needs an API key: send `Authorization: Bearer <key>` "
                           f"(the CLI and client send ${CLIENT_KEY_VARIABLE})")
    if not key_matches(key, keys):
        raise Unauthorized("the API key is not valid")


def header_values(keys: Iterable[str]) -> list[str]:
    """The `Authorization` values the proxy accepts, exactly as clients send them (haproxy matches
    them as plain strings: both common spellings of the scheme are listed)."""
    return [f"{scheme} {key}" for key in keys for scheme in ("Bearer", "bearer")]


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IP literals; anything else (0.0.0.0, ::, a name) is public."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_open_bind(bind: str, settings: "Settings", what: str = "Sluice") -> None:
    """Raise InsecureBind when `bind` is not loopback, no key is configured and the operator has not
    set SLUICE_ALLOW_ANONYMOUS=1: reaching Sluice means running code on its workers."""
    if is_loopback(bind) or settings.api_keys or settings.allow_anonymous:
        return
    raise InsecureBind(
        f"{what} refuses to listen on {bind} without API keys: anyone who reaches it could deploy and run "
        f"code. Set {KEYS_VARIABLE} (or {KEYS_FILE_VARIABLE}), bind 127.0.0.1, or set "
        f"{ALLOW_ANONYMOUS_VARIABLE}=1 to accept anonymous callers."
    )


def _open_bind_refusal() -> Response | None:
    """Without keys, a request that reached this server on a non-loopback address is refused (403).

    `sluice up`, `sluice proxy` and the Docker commands refuse such a bind at start
    (`refuse_open_bind`); this covers a management gunicorn started by hand with `-b 0.0.0.0`,
    judged by the address each connection actually arrived on.
    """
    sock = request.environ.get("gunicorn.socket")
    try:
        local = sock.getsockname() if sock is not None else None
    except OSError:
        local = None
    if not isinstance(local, tuple) or is_loopback(str(local[0])):
        return None  # not gunicorn, a Unix socket, or loopback
    return error_response(
        403, InsecureBind.kind,
        f"this Sluice was reached on {local[0]} without API keys: anyone who reaches it could deploy and run code. "
        f"Set {KEYS_VARIABLE} (or {KEYS_FILE_VARIABLE}), bind 127.0.0.1, or set {ALLOW_ANONYMOUS_VARIABLE}=1",
    )


def request_guard(settings: "Settings") -> Callable[[], Response | None]:
    """A Flask `before_request` hook: with keys set, a request without a valid key is answered 401
    (with `WWW-Authenticate: Bearer`) before any endpoint runs.

    `/healthz` stays open for probes. The fallback `/<name>` answers (why no replica took a
    realtime request) belong to the realtime APIs: they are open exactly when those are.
    """
    keys = settings.api_keys

    def guard() -> Response | None:
        if not keys:
            return None if settings.allow_anonymous or request.path in OPEN_PATHS else _open_bind_refusal()
        if request.path in OPEN_PATHS:
            return None
        if not settings.protect_realtime and (request.endpoint or "").startswith("fallback."):
            return None  # the fallback asks for a key itself when `/<name>` is a BatchAPI's
        return key_refusal(keys)

    return guard


def key_refusal(keys: Iterable[str]) -> Response | None:
    """The 401 (with `WWW-Authenticate: Bearer`) for a request without a valid key; None when it
    has one, or when no keys are set (the guard has then judged the bind already)."""
    keys = tuple(keys)
    if not keys:
        return None
    try:
        authenticate(request.headers.get("Authorization"), keys)
    except Unauthorized as e:
        response = error_response(e.http_status, e.kind, e.message)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    return None
