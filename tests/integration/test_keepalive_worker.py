"""A replica's worker answers one request at a time, as gunicorn's sync worker, but keeps its
connections alive between requests (`sluice/keepalive_worker.py`): a real gunicorn with that worker
class, a tiny WSGI app, and raw HTTP/1.1 connections that show when the worker closes one.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sluice.embedded import free_port
from sluice.replica_process import KEEP_ALIVE_WORKER, ROOT
from testbed.waiting import wait_for

WAIT_S = 30.0
APP = '''
import os
import signal
import time


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/unread":  # answers without reading the body it was sent
        body = b"unread"
    elif path == "/leave":  # asks its own process to stop, then answers (as a replica leaving for memory)
        os.kill(os.getpid(), signal.SIGTERM)
        body = b"pid=%d leaving" % os.getpid()
    elif path == "/gated":  # says it started, then answers once the test opens the gate
        open("started", "w").close()
        give_up = time.monotonic() + 30
        while not os.path.exists("gate") and time.monotonic() < give_up:
            time.sleep(0.01)
        body = b"gated"
    else:
        body = b"pid=%d " % os.getpid() + environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
'''


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log: Path


def start(tmp_path: Path, *options: str) -> Server:
    (tmp_path / "tiny_app.py").write_text(textwrap.dedent(APP))
    port, log = free_port(), tmp_path / "gunicorn.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "--worker-class", KEEP_ALIVE_WORKER,
             "--pythonpath", f"{ROOT},{tmp_path}", *options, "tiny_app:app"],
            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    server = Server(port, process, log)

    def listening() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(listening, WAIT_S, "gunicorn to listen")
    return server


@pytest.fixture
def one_process(tmp_path: Path) -> Iterator[Server]:
    server = start(tmp_path, "-w", "1", "--keep-alive", "120")
    yield server
    server.process.terminate()
    server.process.wait(WAIT_S)


def send(conn: socket.socket, path: str = "/", body: bytes = b"", headers: tuple[str, ...] = ()) -> None:
    head = [f"POST {path} HTTP/1.1", "Host: replica", f"Content-Length: {len(body)}", *headers]
    conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)


def request(conn: socket.socket, path: str = "/", body: bytes = b"", headers: tuple[str, ...] = ()) -> bytes:
    """Send one request; the answer's body (read to its Content-Length)."""
    send(conn, path, body, headers)
    return receive(conn)[1]


def receive(conn: socket.socket) -> tuple[bytes, bytes]:
    """One answer's head and body (read to its Content-Length)."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed before an answer: {answer!r}"
        answer += chunk
    header, rest = answer.split(b"\r\n\r\n", 1)
    [length] = [int(line.split(b":")[1]) for line in header.split(b"\r\n")
                if line.lower().startswith(b"content-length")]
    while len(rest) < length:
        rest += conn.recv(65536)
    return header, rest


def connect(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)


def closed_by_server(conn: socket.socket) -> bool:
    return conn.recv(1) == b""


def test_one_connection_carries_many_requests_each_answered_in_turn(one_process: Server) -> None:
    conn = connect(one_process)
    answers = [request(conn, body=f"row {n}".encode()) for n in range(20)]
    pid = answers[0].split()[0]
    assert answers == [pid + f" row {n}".encode() for n in range(20)]


def test_a_kept_connection_and_new_ones_are_all_served_by_one_process(one_process: Server) -> None:
    first, second = connect(one_process), connect(one_process)
    assert request(first, body=b"a").endswith(b" a")  # first is now kept, idle
    assert request(second, body=b"b").endswith(b" b")  # a new connection, while first is kept
    assert request(first, body=b"c").endswith(b" c")  # the kept one still answered
    third = connect(one_process)
    assert request(third, body=b"d").endswith(b" d") and request(second, body=b"e").endswith(b" e")


def test_a_request_waiting_on_another_kept_connection_makes_the_answer_in_service_close_its_own(
        one_process: Server, tmp_path: Path) -> None:
    # The proxy sent a request to this busy process over a connection it keeps, while another process
    # might be free: the answer in service says Connection: close, so the proxy's next request opens a
    # new connection, which a free process takes.
    busy, waiting = connect(one_process), connect(one_process)
    request(busy, body=b"1")
    request(waiting, body=b"2")  # both connections kept by the one process
    send(busy, "/gated")
    wait_for((tmp_path / "started").exists, WAIT_S, "the worker to run the first request")
    send(waiting, body=b"3")  # arrives while the worker runs the first
    (tmp_path / "gate").touch()
    head, body = receive(busy)
    assert body == b"gated" and b"connection: close" in head.lower()
    assert closed_by_server(busy)
    head, body = receive(waiting)
    assert body.endswith(b" 3") and b"connection: close" not in head.lower()
    assert request(waiting, body=b"4").endswith(b" 4")  # still kept


def test_a_body_the_app_did_not_read_does_not_become_the_next_request(one_process: Server) -> None:
    conn = connect(one_process)
    assert request(conn, "/unread", b"x" * 10_000) == b"unread"
    assert request(conn, body=b"next").endswith(b" next")


def test_a_client_that_asks_to_close_gets_its_answer_then_the_close(one_process: Server) -> None:
    conn = connect(one_process)
    assert request(conn, body=b"bye", headers=("Connection: close",)).endswith(b" bye")
    assert closed_by_server(conn)


def test_requests_sent_together_on_one_connection_are_all_answered(one_process: Server) -> None:
    conn = connect(one_process)
    pipelined = b"".join(f"POST / HTTP/1.1\r\nHost: r\r\nContent-Length: 2\r\n\r\nr{n}".encode() for n in range(3))
    conn.sendall(pipelined)
    received = b""
    deadline = time.monotonic() + WAIT_S
    while received.count(b"HTTP/1.1 200") < 3 or not received.endswith(b" r2"):
        assert time.monotonic() < deadline, received
        received += conn.recv(65536)
    assert [f" r{n}".encode() in received for n in range(3)] == [True] * 3


def test_an_idle_connection_is_closed_after_the_keep_alive(tmp_path: Path) -> None:
    server = start(tmp_path, "-w", "1", "--keep-alive", "1", "--timeout", "2")
    try:
        conn = connect(server)
        assert request(conn, body=b"once").endswith(b" once")
        assert closed_by_server(conn)  # after about a second idle (blocks until then)
        assert request(connect(server), body=b"again").endswith(b" again")  # the worker goes on
    finally:
        server.process.terminate()
        server.process.wait(WAIT_S)


def test_a_stopping_worker_closes_its_kept_connections_and_exits_without_waiting_for_them(tmp_path: Path) -> None:
    # Its wait on the connections lasts up to half of --timeout (100 s), and a stop waits for it up to
    # --graceful-timeout (100 s): the stop's signal must end the wait.
    server = start(tmp_path, "-w", "2", "--keep-alive", "120", "--timeout", "200", "--graceful-timeout", "100")
    kept = [connect(server) for _ in range(4)]
    for n, conn in enumerate(kept):
        assert request(conn, body=str(n).encode()).endswith(str(n).encode())
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(WAIT_S) == 0, server.log.read_text()
    assert all(closed_by_server(conn) for conn in kept)


def test_a_process_asked_to_stop_while_it_answers_closes_that_connection_in_the_answer(
        one_process: Server) -> None:
    # The proxy keeps the connection only while the answer says so: one closed just after a keep-alive
    # answer could take the proxy's next request down with it.
    conn = connect(one_process)
    send(conn, "/leave")
    head, body = receive(conn)
    assert body.endswith(b" leaving") and b"connection: close" in head.lower()
    assert closed_by_server(conn)
    pid = int(body.split()[0].removeprefix(b"pid="))
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), WAIT_S, "the process to leave")
    answer = request(connect(one_process), body=b"next")  # the arbiter started another
    assert answer.endswith(b" next") and int(answer.split()[0].removeprefix(b"pid=")) != pid


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_worker_is_replaced_and_the_next_connection_is_served(one_process: Server) -> None:
    conn = connect(one_process)
    pid = int(request(conn, body=b"x").split()[0].removeprefix(b"pid="))
    os.kill(pid, signal.SIGKILL)
    assert closed_by_server(conn)  # the process that kept it is gone

    def served_by_a_new_worker() -> bool:
        try:
            answer = request(connect(one_process), body=b"y")
        except (OSError, AssertionError):
            return False
        return answer.startswith(b"pid=") and int(answer.split()[0].removeprefix(b"pid=")) != pid

    wait_for(served_by_a_new_worker, WAIT_S, "gunicorn to replace the killed worker")
