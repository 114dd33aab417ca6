"""What the client's Cortex-named methods return, whichever server shape answers.

A server from before Cortex's endpoint shape answered `/<name>` for a RealtimeAPI's endpoint and
none for a BatchAPI's; one after answers `<host_url>/<name>`. Either way the client gives Cortex's
absolute URL. Against a real HTTP server on 127.0.0.1 (http.server in a thread).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

from sluice.client import Client

JOB_STATUS = {"job_id": "j1", "api_name": "bt", "status": "status_running"}


class Answers:
    """A server answering GETs from a path -> JSON body table."""

    def __init__(self) -> None:
        self.bodies: dict[str, dict[str, Any]] = {}
        answers = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = answers.bodies.get(urlsplit(self.path).path)
                data = json.dumps(body or {"kind": "not_found", "message": self.path}).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Answers]:
    answers = Answers()
    yield answers
    answers.server.shutdown()
    answers.server.server_close()


@pytest.mark.parametrize("endpoint", ["/rt", None, "http://public.example:8888/rt"])
def test_get_api_gives_an_absolute_endpoint(server, endpoint):
    body: dict[str, Any] = {"name": "rt", "kind": "RealtimeAPI"}
    if endpoint is not None:
        body["endpoint"] = endpoint
    server.bodies["/apis/rt"] = body

    described = Client(server.url).get_api("rt")

    expected = endpoint if endpoint and endpoint.startswith("http") else f"{server.url}/rt"
    assert described["endpoint"] == expected and described["kind"] == "RealtimeAPI"


@pytest.mark.parametrize("endpoint", ["/bt", "http://public.example:8888/bt"])
def test_get_job_is_cortexs_shape_and_job_is_the_bare_status(server, endpoint):
    server.bodies["/batch/bt"] = {"job_status": JOB_STATUS, "endpoint": endpoint, "api_spec": {"name": "bt"}}
    client = Client(server.url)

    job = client.get_job("bt", "j1")

    assert set(job) == {"job_status", "endpoint", "api_spec"}
    assert job["job_status"] == JOB_STATUS and job["api_spec"] == {"name": "bt"}
    assert job["endpoint"] == (endpoint if endpoint.startswith("http") else f"{server.url}/bt")
    assert client.job("bt", "j1") == JOB_STATUS


@pytest.mark.parametrize(("answer", "call"), [
    (b"[1, 2]", lambda c: c.api("iris")),                  # JSON, but not the object the API documents
    (b'"text"', lambda c: c.job("iris", "j1")),
    (b'{"apis": "not a list"}', lambda c: c.apis()),       # an object whose documented list is not one
])
def test_an_answer_of_the_wrong_shape_is_a_server_error_that_says_so(monkeypatch, answer, call):
    import requests

    from sluice.client import ServerError

    response = requests.Response()
    response.status_code, response._content = 200, answer
    client = Client("http://127.0.0.1:1")
    monkeypatch.setattr(client, "_request", lambda method, path, **kwargs: response)

    with pytest.raises(ServerError, match="bad_response"):
        call(client)
