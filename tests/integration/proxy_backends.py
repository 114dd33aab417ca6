"""A tiny WSGI app standing in for replicas and the management API behind a real haproxy.

Run with gunicorn, named by `PROXY_BACKEND_NAME`:

    PROXY_BACKEND_NAME=r1 gunicorn -k gthread --threads 8 tests.integration.proxy_backends:app

Every request but `/_seen` is answered (after `?sleep=<seconds>`, or once the file named by
`?gate=<path>` exists) with who answered and the headers the proxy set; `/_seen` lists the
requests this process has started, so a test can tell which requests reached it at all (a queued
request whose client left must never start).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

_seen: list[dict[str, Any]] = []
_lock = threading.Lock()


def _respond(start_response: Callable, status: str, body: dict[str, Any]) -> Iterable[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def app(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
    path = environ.get("PATH_INFO", "")
    if path == "/_seen":
        with _lock:
            return _respond(start_response, "200 OK", {"seen": list(_seen)})
    query = parse_qs(environ.get("QUERY_STRING", ""))
    request = {
        "server": os.environ.get("PROXY_BACKEND_NAME", "?"),
        "path": path,
        "method": environ.get("REQUEST_METHOD"),
        "tag": query.get("tag", [""])[0],
        "request_id": environ.get("HTTP_X_REQUEST_ID"),
        "deadline_ms": environ.get("HTTP_X_SLUICE_DEADLINE_MS"),
        "shadow_of": environ.get("HTTP_X_SLUICE_SHADOW_OF"),
        "query": environ.get("QUERY_STRING", ""),
        "started": time.time(),
    }
    with _lock:
        _seen.append(request)
    length = int(environ.get("CONTENT_LENGTH") or 0)
    received = 0
    stream = environ["wsgi.input"]
    while received < length:
        chunk = stream.read(min(1 << 20, length - received))
        if not chunk:
            break
        received += len(chunk)
    request["body_bytes"] = received
    time.sleep(float(query.get("sleep", ["0"])[0]))
    gate, given_up = query.get("gate", [""])[0], time.monotonic() + 60
    while gate and not os.path.exists(gate) and time.monotonic() < given_up:
        time.sleep(0.01)
    return _respond(start_response, "200 OK", request)
