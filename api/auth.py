"""API keys at the management API's door: a request without a valid key is answered here.

What keys are, how they are read and compared, is the foundation's (`foundation/api_keys.py`);
this module turns its verdicts into HTTP answers before any endpoint runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from flask import Response, request

from foundation.api_keys import (
    ADMIN,
    ALLOW_ANONYMOUS_VARIABLE,
    KEYS_FILE_VARIABLE,
    KEYS_VARIABLE,
    authenticate,
    is_loopback,
    needs_admin,
    presented_key,
    role_of,
)
from foundation.errors import Forbidden, InsecureBind, Unauthorized

from .errors import error_response

if TYPE_CHECKING:
    from foundation.settings import Settings

# Answered without credentials: what a load balancer or orchestrator probes, and the HTTP API's
# docs (the same for every Sluice of a version: they name no deployed API).
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs"})
OPEN_PREFIXES = ("/docs/assets/",)


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def open_bind_address(environ: Mapping[str, Any]) -> str | None:
    """The address a request reached this server on, when gunicorn took it on a non-loopback one;
    None for loopback, a Unix socket, or a server other than gunicorn."""
    sock = environ.get("gunicorn.socket")
    try:
        local = sock.getsockname() if sock is not None else None
    except OSError:
        local = None
    if not isinstance(local, tuple) or is_loopback(str(local[0])):
        return None
    return str(local[0])


def _open_bind_refusal() -> Response | None:
    """Without keys, a request that reached this server on a non-loopback address is refused (403).

    `sluice up`, `sluice proxy` and the Docker commands refuse such a bind at start
    (`refuse_open_bind`); this covers a management gunicorn started by hand with `-b 0.0.0.0`,
    judged by the address each connection actually arrived on.
    """
    address = open_bind_address(request.environ)
    if address is None:
        return None
    return error_response(
        403, InsecureBind.kind,
        f"this Sluice was reached on {address} without API keys: anyone who reaches it could deploy and run code. "
        f"Set {KEYS_VARIABLE} (or {KEYS_FILE_VARIABLE}), bind 127.0.0.1, or set {ALLOW_ANONYMOUS_VARIABLE}=1",
    )


def request_guard(settings: Settings) -> Callable[[], Response | None]:
    """A Flask `before_request` hook: with keys set, a request without a valid key is answered 401
    (with `WWW-Authenticate: Bearer`) before any endpoint runs.

    `/healthz` stays open for probes, and the API docs for browsers. The fallback `/<name>` answers
    (why no replica took a realtime request) belong to the realtime APIs: they are open exactly
    when those are.
    """
    keys = settings.api_keys

    def guard() -> Response | None:
        if not keys:
            return None if settings.allow_anonymous or is_open_path(request.path) else _open_bind_refusal()
        if is_open_path(request.path):
            return None
        if not settings.protect_realtime and (request.endpoint or "").startswith("fallback."):
            return None  # the fallback asks for a key itself when `/<name>` is a BatchAPI's
        return key_refusal(keys) or role_refusal(settings)

    return guard


def role_refusal(settings: Settings) -> Response | None:
    """The 403 for a valid key whose role may not make this request (an `invoke` key changing an API)."""
    if not needs_admin(request.method, request.path):
        return None
    key = presented_key(request.headers.get("Authorization")) or ""
    role = role_of(key, settings.key_roles) or ADMIN  # a key of no named role is admin
    if role == ADMIN:
        return None
    return error_response(403, Forbidden.kind, f"{request.method} {request.path} needs an admin key: the key given is "
                          f"an {role} key (it may submit and read jobs, tasks and async requests, and call APIs)")


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
