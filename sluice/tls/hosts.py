"""TLS between Sluice's hosts: what a host serves its replicas with, and what the proxy checks.

A replica host given a certificate and key (`SLUICE_HOST_TLS_CERT`, `SLUICE_HOST_TLS_KEY`) serves
its replicas over TLS only (gunicorn's `--certfile`/`--keyfile`, the gRPC replica's secure port; no
plain Unix socket beside them), and says so in each replica's record; a proxy routes such a
replica over TLS, checking its certificate against `SLUICE_HOST_TLS_CA` (else the system's CAs) and
its name against the address the replica is reached at. The certificate must name that address
(the host's `--advertise`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from foundation.errors import ConfigError

CERT_VARIABLE = "SLUICE_HOST_TLS_CERT"
KEY_VARIABLE = "SLUICE_HOST_TLS_KEY"
CA_VARIABLE = "SLUICE_HOST_TLS_CA"
SYSTEM_CAS = "@system-ca"  # haproxy's name for the system's CA bundle


@dataclass(frozen=True)
class HostTls:
    """This host's certificate and key for what it serves to other hosts."""

    cert: str
    key: str

    def gunicorn_argv(self) -> list[str]:
        return ["--certfile", self.cert, "--keyfile", self.key]


def _file(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name) or None
    if value is not None and not Path(value).is_file():
        raise ConfigError(f"{name}: {value} is not a file")
    return value


def host_tls(env: Mapping[str, str]) -> HostTls | None:
    """The host's certificate and key from `env`, both or neither (checked: they must be files)."""
    cert, key = _file(env, CERT_VARIABLE), _file(env, KEY_VARIABLE)
    if (cert is None) != (key is None):
        raise ConfigError(f"{CERT_VARIABLE} and {KEY_VARIABLE} go together (this host's certificate and its key)")
    return HostTls(cert, key) if cert is not None and key is not None else None


def backend_cas(env: Mapping[str, str]) -> str:
    """What the proxy checks a TLS backend's certificate against: `SLUICE_HOST_TLS_CA`, else the system's CAs."""
    return _file(env, CA_VARIABLE) or SYSTEM_CAS
