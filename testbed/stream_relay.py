"""A TCP relay a test puts in front of a Redis primary, to cut its replication stream without
closing the connection: a slow or broken link, as the replica sees it.

Everyone reaches the primary through it (the sentinels monitor the relay's address, so they never
"correct" a replica that replicates from it), and `drop()` discards, from then on, what the primary
sends on replication connections only (those whose client sent `PSYNC` or `SYNC`): the replica's
own acknowledgements still reach the primary, which keeps counting it connected, and every other
client is served as before. SIGSTOP on the replica would not do: the kernel keeps taking the stream
into its socket buffers.
"""

from __future__ import annotations

import contextlib
import socket
import threading

CHUNK = 65536


class StreamRelay:
    """Listens on a free loopback port and forwards each connection to `target_port`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._dropping = threading.Event()
        self._closed = threading.Event()
        self.dropped_bytes = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="stream-relay", daemon=True).start()

    def drop(self) -> None:
        """From now on, what the target sends is read and thrown away."""
        self._dropping.set()

    def close(self) -> None:
        self._closed.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=10)
            except OSError:
                return
            upstream.settimeout(None)
            self._sockets += [downstream, upstream]
            replication = threading.Event()
            threading.Thread(target=self._pump, args=(downstream, upstream, replication, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, replication, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, replication: threading.Event,
              from_target: bool) -> None:
        try:
            while data := source.recv(CHUNK):
                if not from_target and (b"PSYNC" in data.upper() or b"\r\nSYNC\r\n" in data.upper()):
                    replication.set()
                if from_target and replication.is_set() and self._dropping.is_set():
                    self.dropped_bytes += len(data)
                    continue
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
