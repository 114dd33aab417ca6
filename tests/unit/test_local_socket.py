"""A replica on the proxy's own host is reached over its Unix socket; any other over TCP."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from sluice.local_socket import MAX_PATH_BYTES, host_identity, reachable_socket, remove_stale, socket_path_for


def listening_socket(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def test_a_replica_gets_a_short_path_of_its_own_in_the_temp_folder() -> None:
    first, second = socket_path_for("iris-9001-aa"), socket_path_for("iris-9002-bb")
    assert first and second and first != second
    assert Path(first).parent == Path(tempfile.gettempdir()) and first.endswith(".sock")
    assert socket_path_for("iris-9001-aa") == first  # the same id, the same path


def test_no_path_when_the_folder_makes_it_too_long_or_unsafe_for_the_proxy_config(tmp_path: Path) -> None:
    assert socket_path_for("iris", "/" + "x" * MAX_PATH_BYTES) is None
    assert socket_path_for("iris", "/tmp/with space") is None


def test_the_socket_is_used_only_from_the_host_it_was_announced_from(tmp_path: Path) -> None:
    path = str(tmp_path / "r.sock")
    with listening_socket(tmp_path / "r.sock"):
        here = host_identity()
        assert reachable_socket(path, here) == path
        assert reachable_socket(path, "another-boot/another-host") is None
        assert reachable_socket(path, "") is None
        assert reachable_socket("", here) is None


def test_a_path_that_is_not_a_socket_or_is_gone_is_not_used(tmp_path: Path) -> None:
    plain = tmp_path / "plain.sock"
    plain.write_text("not a socket")
    assert reachable_socket(str(plain), host_identity()) is None
    assert reachable_socket(str(tmp_path / "gone.sock"), host_identity()) is None


def test_only_a_left_over_socket_is_removed(tmp_path: Path) -> None:
    server = listening_socket(tmp_path / "old.sock")
    server.close()  # what a killed gunicorn leaves behind
    remove_stale(str(tmp_path / "old.sock"))
    assert not (tmp_path / "old.sock").exists()
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    remove_stale(str(plain))
    assert plain.read_text() == "keep me"
    remove_stale(None)
    remove_stale(str(tmp_path / "never-was"))
