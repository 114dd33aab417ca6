"""The management API's server as `sluice up` and the Docker files start it (`api/gunicorn_config.py`):
threads that keep a connection open for the next request, which is how the proxy in front of it
sends request after request without a new connection each time."""

from __future__ import annotations

import http.client
import os
import socket
import threading
from urllib.parse import urlparse

from jobs.batch.line_checks import MAX_HELPERS

from .processes import children_of, command_of


def _connection(stack, timeout: float = 10) -> http.client.HTTPConnection:
    address = urlparse(stack.management_url)
    return http.client.HTTPConnection(address.hostname, address.port, timeout=timeout)


def test_the_management_api_answers_many_requests_on_one_connection(stack):
    connection = _connection(stack)
    try:
        answers = []
        for _ in range(3):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            response.read()
            answers.append((response.status, response.getheader("Connection")))
        assert answers == [(200, "keep-alive")] * 3
        assert connection.sock is not None  # still open: all three went over it
    finally:
        connection.close()


def test_slow_requests_in_every_process_do_not_hold_up_the_others(stack):
    # As many clients as the API has processes send a request's first lines and stall: each holds a
    # thread of its own, and reads are still answered (one thread per process would leave none free).
    address = urlparse(stack.management_url)
    slow = []
    for _ in range(stack.api_processes):
        sock = socket.create_connection((address.hostname, address.port), timeout=30)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: sluice\r\n")  # the headers' end never comes
        slow.append(sock)
    answered: list[int] = []
    done = threading.Event()

    def reads() -> None:
        for _ in range(8):
            connection = _connection(stack)
            connection.request("GET", "/healthz")
            answered.append(connection.getresponse().status)
            connection.close()
        done.set()

    try:
        threading.Thread(target=reads, daemon=True).start()
        assert done.wait(20), f"reads stalled behind the slow requests: {answered}"
        assert answered == [200] * 8
    finally:
        for sock in slow:
            sock.close()


def test_every_api_process_has_its_json_lines_helpers_before_any_large_file(stack):
    # Started with the process (gunicorn's post_worker_init), not by its first large `delimited_files`
    # job, which would otherwise wait for them; the tests submit no file that large.
    master = next(child.process.pid for child in stack.children if child.name == "api")
    workers = children_of(master)
    assert len(workers) == stack.api_processes
    expected = min(MAX_HELPERS, os.cpu_count() or 1)
    for worker in workers:
        helpers = [pid for pid in children_of(worker) if "jobs.batch.line_checks" in command_of(pid)]
        assert len(helpers) == expected, (worker, helpers)
