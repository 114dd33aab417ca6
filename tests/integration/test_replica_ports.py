"""Replica ports on a busy host: a port whose last connections linger in TIME_WAIT is still one a
replica's gunicorn can bind (it sets SO_REUSEADDR), so the port finder must count it free, or a
host that has just served heavy traffic finds no pair of ports for a new replica."""

from __future__ import annotations

import socket

import pytest

from sluice.replica_manager import _bindable, free_port_pair

pytestmark = pytest.mark.integration


def _port_left_in_time_wait() -> int:
    """A loopback port with no listener but a server-side connection in TIME_WAIT (the server
    closed first, as a replica does when it ends a kept-alive connection)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as caller:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: it is the side left in TIME_WAIT
            caller.recv(1)  # the caller sees the close, then closes too
    return port


def test_a_port_whose_connections_linger_in_time_wait_counts_as_free() -> None:
    port = _port_left_in_time_wait()
    with socket.socket() as plain, pytest.raises(OSError, match="Address already in use"):
        plain.bind(("127.0.0.1", port))  # what the finder used to try: refused while TIME_WAIT lasts
    assert _bindable(port)
    with socket.socket() as gunicorn_like:  # and what a replica's gunicorn then does succeeds
        gunicorn_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        gunicorn_like.bind(("127.0.0.1", port))


def test_a_port_with_a_listener_is_not_free_and_no_pair_includes_it() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not _bindable(port)
        for _ in range(20):
            pair = free_port_pair()
            assert port not in (pair, pair + 1)
