"""Replicas on the proxy's own host are reached over a Unix socket instead of TCP on loopback.

Every replica listens on its TCP address (for proxies on other hosts, and for direct calls) and,
beside it, on a Unix socket named after its replica id. A proxy that finds a replica announced
from its own host (same kernel boot and host name) with that socket present routes to the socket.

Why: a replica's sync workers close the connection after each answer, so the proxy connects once
per request. Over loopback TCP that connect, accept and close cost the proxy about 210-280 us of
CPU per request on the 2-core machine of `bench/realtime.py`, against 150-165 us over a Unix
socket, and the replica less as well: about 0.1 ms of a small model's latency, and a fifth of
the proxy's share of the CPU at 8 clients.

Host identity is the kernel's boot id and the host name together: containers share the boot id
but not the host name (nor, usually, the filesystem), and network-namespace "hosts" in tests
are told apart by the name the same way.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
import tempfile
from functools import lru_cache
from pathlib import Path

# sockaddr_un holds 108 bytes with the terminating NUL; stay clear of it.
MAX_PATH_BYTES = 100
_SAFE_PATH_RE = re.compile(r"^/[A-Za-z0-9_./-]+$")  # goes into haproxy's config as is
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@lru_cache(maxsize=1)
def host_identity() -> str:
    """This host as replicas and proxies compare it: `<boot id>/<host name>`."""
    try:
        boot = _BOOT_ID.read_text(encoding="ascii").strip()
    except OSError:
        boot = ""
    return f"{boot}/{socket.gethostname()}"


def socket_path_for(replica_id: str, folder: str | None = None) -> str | None:
    """Where the replica `replica_id` listens besides its TCP port; None when no usable path fits."""
    digest = hashlib.sha256(replica_id.encode()).hexdigest()[:20]
    path = os.path.join(folder or tempfile.gettempdir(), f"sluice-{digest}.sock")
    if len(os.fsencode(path)) > MAX_PATH_BYTES or not _SAFE_PATH_RE.match(path):
        return None
    return path


def reachable_socket(path: str, host_id: str, here: str | None = None) -> str | None:
    """`path` when a replica announced from `host_id` can be reached there from this host, else None."""
    if not path or not host_id or host_id != (here if here is not None else host_identity()):
        return None
    if not _SAFE_PATH_RE.match(path) or len(os.fsencode(path)) > MAX_PATH_BYTES:
        return None
    try:
        return path if stat.S_ISSOCK(os.stat(path).st_mode) else None
    except OSError:
        return None


def remove_stale(path: str | None) -> None:
    """Remove a socket file a previous replica of the same id left (never anything else)."""
    if not path:
        return
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass
