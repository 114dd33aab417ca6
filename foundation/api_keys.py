"""API keys: who may call Sluice, as every process reads and checks them.

A deploy uploads a program that every worker runs, so an open management API runs anyone's code.
With keys configured (`SLUICE_API_KEYS`, comma-separated, and/or `SLUICE_API_KEYS_FILE`, one key
a line) every management endpoint but `/healthz` wants `Authorization: Bearer <key>`; the proxy
asks the same of realtime APIs when `SLUICE_PROTECT_REALTIME=1`. Without keys Sluice is open, but
then, like Redis's protected mode, `sluice proxy` (the public entry) refuses to listen on anything
but loopback unless the operator says `SLUICE_ALLOW_ANONYMOUS=1`.

A key has a role: `admin` may do everything; `invoke` may submit and read jobs, tasks and async
requests and call realtime APIs, but not deploy, delete or otherwise change an API (`POST`,
`PUT`, `PATCH` or `DELETE` under `/apis`). A line of the keys file may name the role after the key
(`KEY invoke`); a bare key, and every key of `SLUICE_API_KEYS`, is `admin`.

Reading and comparing keys lives here, below every process (the settings read them, the proxy
writes them into haproxy's configuration); answering a request without one is the HTTP layer's
(`api/auth.py`). Nothing here reads the environment at import; `load_api_keys` is called once by
`Settings.from_env`.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ConfigError, InsecureBind, Unauthorized

if TYPE_CHECKING:
    from .settings import Settings

KEYS_VARIABLE = "SLUICE_API_KEYS"
KEYS_FILE_VARIABLE = "SLUICE_API_KEYS_FILE"
CLIENT_KEY_VARIABLE = "SLUICE_API_KEY"
ALLOW_ANONYMOUS_VARIABLE = "SLUICE_ALLOW_ANONYMOUS"
PROTECT_REALTIME_VARIABLE = "SLUICE_PROTECT_REALTIME"
# Visible ASCII but the comma (the separator of SLUICE_API_KEYS): a key travels in an HTTP
# header and in haproxy's pattern file, where whitespace or control characters would change it.
_KEY_RE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")
_SCHEME = "bearer"


def _checked(key: str, source: str) -> str:
    if not _KEY_RE.fullmatch(key):
        raise ConfigError(f"{source}: an API key must be printable ASCII without spaces or commas")
    return key


ADMIN, INVOKE = "admin", "invoke"
ROLES = (ADMIN, INVOKE)


def parse_keys_file(text: str, source: str = KEYS_FILE_VARIABLE) -> tuple[str, ...]:
    """The keys of a keys file, whatever their role (see `parse_key_roles`)."""
    return tuple(parse_key_roles(text, source))


def parse_key_roles(text: str, source: str = KEYS_FILE_VARIABLE) -> dict[str, str]:
    """Key -> role, one key a line with its role after it (`KEY invoke`; none: `admin`); blank lines
    and `#` comments are skipped, surrounding spaces dropped. An unknown role is an error naming the line."""
    roles: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, role = line.partition(" ")
        role = role.strip() or ADMIN
        if role not in ROLES:
            raise ConfigError(f"{source}: line {number}: unknown role {role!r} (roles: {', '.join(ROLES)})")
        roles[_checked(key, source)] = role
    return roles


def load_key_roles(env: Mapping[str, str]) -> dict[str, str]:
    """Key -> role, of `SLUICE_API_KEYS` (each `admin`) and of the file `SLUICE_API_KEYS_FILE` names.
    An unreadable keys file is an error: starting open would be a silent downgrade."""
    roles = {_checked(k.strip(), KEYS_VARIABLE): ADMIN
             for k in (env.get(KEYS_VARIABLE) or "").split(",") if k.strip()}
    path = env.get(KEYS_FILE_VARIABLE)
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{KEYS_FILE_VARIABLE}: cannot read {path}: {e}") from e
        for key, role in parse_key_roles(text).items():
            roles.setdefault(key, role)  # a key of the variable stays admin
    return roles


def load_api_keys(env: Mapping[str, str]) -> tuple[str, ...]:
    """The keys of `SLUICE_API_KEYS` and of the file `SLUICE_API_KEYS_FILE` names, in that order,
    without repeats, whatever their role."""
    return tuple(load_key_roles(env))


def needs_admin(method: str, path: str) -> bool:
    """Whether a request changes an API: only an `admin` key may make it."""
    return method not in ("GET", "HEAD", "OPTIONS") and (path == "/apis" or path.startswith("/apis/"))


def role_of(presented: str, roles: Mapping[str, str]) -> str | None:
    """The role of the key presented, compared in constant time with every key; None if none matches."""
    given = hashlib.sha256(presented.encode()).digest()
    found: str | None = None
    for key, role in roles.items():
        if hmac.compare_digest(given, hashlib.sha256(key.encode()).digest()):
            found = role
    return found


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


@functools.lru_cache(maxsize=256)  # asked for the address of every AsyncAPI submission (api/async_front.py)
def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IP literals; anything else (0.0.0.0, ::, a name) is public."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def refuse_open_bind(bind: str, settings: Settings, what: str = "Sluice") -> None:
    """Raise InsecureBind when `bind` is not loopback, no key is configured and the operator has not
    set SLUICE_ALLOW_ANONYMOUS=1: reaching Sluice means running code on its workers."""
    if is_loopback(bind) or settings.api_keys or settings.allow_anonymous:
        return
    raise InsecureBind(
        f"{what} refuses to listen on {bind} without API keys: anyone who reaches it could deploy and run "
        f"code. Set {KEYS_VARIABLE} (or {KEYS_FILE_VARIABLE}), bind 127.0.0.1, or set "
        f"{ALLOW_ANONYMOUS_VARIABLE}=1 to accept anonymous callers."
    )
