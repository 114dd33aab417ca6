"""A replica's gunicorn worker for one request at a time that keeps its connections alive.

gunicorn's sync worker closes every connection after one answer ("until someone shows a buffering
proxy that supports keep-alive to the backend", says its source): behind HAProxy that cost a new
connection per request on both sides, four of haproxy's ten system calls a request, and a worker
that accepted a connection before haproxy had written the request into it slept until it had
(docs/realtime.md, "The public address and its cost"). This worker is the sync worker with that
one difference: after an answer the connection is kept, and the worker waits for the next request
on any connection it keeps or a new one on its listeners, in one `poll`, and serves whichever
comes first, one at a time. Measured with `bench/proxy_hop.py`'s server on 2 cores: 1.2-1.5x the
requests/s through the proxy, 1.2-1.5x for a client reaching the replica directly (iris, 1 to 64 clients).

What stays as the sync worker has it: one request at a time per process (so gunicorn's
`--timeout` still ends a worker stuck in `predict`, as it reports only between requests), the
request hooks, the access log, `max_requests`, errors answered as gunicorn answers them. A kept
connection is closed when its client asks (`Connection: close`), when the request's unread body
cannot be drained, with the answer to a request while another request waits on another connection
this process keeps (`_others_waiting`: the proxy's connections spread over the processes that are
free), after `--keep-alive` seconds idle (longer than haproxy keeps an idle server connection, so
that haproxy, not the replica, closes it: a request is never sent on a connection the replica is
closing), beyond `MAX_KEPT` connections (the longest idle first), and when the worker stops (after
its request in progress, whose answer says `Connection: close` when the stop came while the app
ran it: the replica app leaving for memory asks its own stop before it answers).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import ssl
import time
from datetime import datetime
from typing import Any

from gunicorn import http, util
from gunicorn import sock as gunicorn_sock
from gunicorn.http import wsgi
from gunicorn.workers.sync import SyncWorker

# Connections one process keeps at most; behind the proxy it holds about one per request it may run.
MAX_KEPT = 64
# How long draining a request's unread body may take before the connection is closed instead.
DRAIN_S = 5.0
_READABLE = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR


class _Connection:
    """One client connection: its socket, its request parser (which may hold bytes read ahead) and
    since when it waits idle."""

    __slots__ = ("address", "idle_since", "parser", "server", "sock")

    def __init__(self, sock: socket.socket, address: Any, server: Any, parser: Any) -> None:
        self.sock, self.address, self.server, self.parser = sock, address, server, parser
        self.idle_since = 0.0

    def has_read_ahead(self) -> bool:
        """Bytes of a next request already read (a client that pipelines) or held by TLS."""
        pending = self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0
        return pending > 0 or bool(self.parser.unreader.buf.getvalue())


class KeepAliveSyncWorker(SyncWorker):  # type: ignore[misc]
    """gunicorn's sync worker, keeping its connections alive (`sluice/replica_process.py` names it)."""

    def run(self) -> None:
        timeout_ms = int((self.timeout or 0.5) * 1000)
        listeners = {s.fileno(): s for s in self.sockets}
        for listener in self.sockets:
            listener.setblocking(False)
        kept: dict[int, _Connection] = {}
        self._kept = kept  # the connections kept idle, by file descriptor (the one in service is not)
        poller = select.poll()  # registering costs no system call; one `poll` a wait
        for fd in (*listeners, self.PIPE[0]):
            poller.register(fd, _READABLE)
        try:
            while self.alive:
                self.notify()
                try:
                    ready = poller.poll(timeout_ms)
                except OSError as e:
                    if e.errno == errno.EINTR:
                        continue
                    raise
                # What each ready descriptor was when it was found ready: one dropped meanwhile (and its
                # number reused by a connection accepted since) is not read.
                found = [(fd, listeners.get(fd) or kept.get(fd)) for fd, _events in ready]
                for fd, target in found:
                    if not self.alive:
                        break
                    if fd == self.PIPE[0]:
                        os.read(fd, 1)
                        continue
                    connection = self._take(fd, target, kept, poller)
                    if connection is not None:
                        self._serve_and_keep(connection, kept, poller)
                    self.notify()
                self._close_idle(kept, poller)
                if not self.is_parent_alive():
                    break
        finally:
            for connection in kept.values():
                util.close(connection.sock)

    def _take(self, fd: int, target: socket.socket | _Connection | None, kept: dict[int, _Connection],
              poller: select.poll) -> _Connection | None:
        """The connection to serve for a ready descriptor: a kept one, still kept, or a new one accepted."""
        if isinstance(target, _Connection):
            if kept.get(fd) is not target:
                return None
            del kept[fd]
            poller.unregister(fd)
            return target
        return self._accept(target) if target is not None else None

    def _serve_and_keep(self, connection: _Connection, kept: dict[int, _Connection], poller: select.poll) -> None:
        """Serve the connection's request (and any read ahead), then keep it unless it was closed."""
        while self._serve(connection):
            if not connection.has_read_ahead():
                connection.idle_since = time.monotonic()
                self._keep(connection, kept, poller)
                return

    def _accept(self, listener: socket.socket) -> _Connection | None:
        try:
            client, address = listener.accept()
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                return None  # another process took it
            raise
        client.setblocking(True)
        util.close_on_exec(client)
        if self.cfg.is_ssl:
            client = gunicorn_sock.ssl_wrap_socket(client, self.cfg)
        return _Connection(client, address, listener.getsockname(), http.get_parser(self.cfg, client, address))

    def _keep(self, connection: _Connection, kept: dict[int, _Connection], poller: select.poll) -> None:
        if len(kept) >= MAX_KEPT:
            oldest = min(kept.values(), key=lambda c: c.idle_since)
            self._drop(oldest, kept, poller)
        fd = connection.sock.fileno()
        connection.sock.setblocking(False)  # idle: only `poll` looks at it
        kept[fd] = connection
        poller.register(fd, _READABLE)

    def _close_idle(self, kept: dict[int, _Connection], poller: select.poll) -> None:
        if not kept:
            return
        since = time.monotonic() - self.cfg.keepalive
        for connection in [c for c in kept.values() if c.idle_since < since]:
            self._drop(connection, kept, poller)

    @staticmethod
    def _drop(connection: _Connection, kept: dict[int, _Connection], poller: select.poll) -> None:
        fd = connection.sock.fileno()
        kept.pop(fd, None)
        poller.unregister(fd)
        util.close(connection.sock)

    def _serve(self, connection: _Connection) -> bool:
        """Answer the connection's next request; whether the connection is to be kept (else it is closed)."""
        connection.sock.setblocking(True)
        request = None
        try:
            request = next(connection.parser)
            if self._answer(request, connection):
                return bool(connection.parser.finish_body(deadline=time.monotonic() + DRAIN_S))
        except http.errors.NoMoreData as e:
            self.log.debug("Ignored premature client disconnection. %s", e)
        except StopIteration as e:
            self.log.debug("Closing connection. %s", e)
        except ssl.SSLError as e:
            if e.args[0] != ssl.SSL_ERROR_EOF:
                self.log.debug("Error processing SSL request.")
                self.handle_error(request, connection.sock, connection.address, e)
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                self.log.exception("Socket error processing request.")
        except BaseException as e:  # noqa: BLE001 - answered as gunicorn's sync worker answers it
            self.handle_error(request, connection.sock, connection.address, e)
        util.close_graceful(connection.sock)
        return False

    def _others_waiting(self) -> bool:
        """Whether a request already waits on another connection this process keeps: the proxy sent it
        here because it had an idle connection to this process, while another process may be free.
        The answer in service then closes its connection (saying so in its `Connection` header, so
        that the proxy never sends on it again: no race), and the proxy's next request opens a new
        one, which a free process takes. So no process keeps more connections than it has requests
        to run, and one gunicorn starts again after one died gets its share."""
        if not self._kept:
            return False
        waiting = select.poll()
        for fd in self._kept:
            waiting.register(fd, _READABLE)
        return bool(waiting.poll(0))

    def _answer(self, request: Any, connection: _Connection) -> bool:
        """gunicorn's `SyncWorker.handle_request` without its forced close: whether the connection
        may serve another request."""
        environ: dict[str, Any] = {}
        response = None
        try:
            self.cfg.pre_request(self, request)
            started = datetime.now()
            response, environ = wsgi.create(request, connection.sock, connection.address, connection.server, self.cfg)
            self.nr += 1
            if self.nr >= self.max_requests:
                self.log.info("Autorestarting worker after current request.")
                self.alive = False
            if not self.alive or not self.cfg.keepalive:
                response.force_close()
            body = self.wsgi(environ, response.start_response)
            # Asked once the app has run, before the answer's headers go out: a process told to stop
            # meanwhile (the replica app leaving for memory) closes this connection in the answer, so the
            # proxy sends nothing more on a connection about to close (a request it sent would be lost).
            if not self.alive or self._others_waiting():
                response.force_close()
            try:
                if isinstance(body, environ["wsgi.file_wrapper"]):
                    response.write_file(body)
                else:
                    for item in body:
                        response.write(item)
                response.close()
            finally:
                self.log.access(response, request, environ, datetime.now() - started)
                if hasattr(body, "close"):
                    body.close()
            return not response.should_close()
        except OSError:
            raise  # the connection's own failure: `_serve` closes it
        except (Exception, SystemExit):
            if response is not None and response.headers_sent:
                # As the sync worker: an answer already started cannot carry an error page too.
                self.log.exception("Error handling request")
                util.close_graceful(connection.sock)
                raise StopIteration() from None
            raise
        finally:
            try:
                self.cfg.post_request(self, request, environ, response)
            except Exception:  # as the sync worker: a hook's failure is logged only
                self.log.exception("Exception in post_request hook")
