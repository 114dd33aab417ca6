"""A store call whose answer is read later: the call is sent, the caller goes on, then reads it.

A node's batch waits on Redis twice: its begin (may it run?) and its record (counted once). Each
is one script and one round trip, about 0.2 ms when the host is busy, in which the node did
nothing (`bench/onnx_batch.py`: a tenth of a small model's batch each). Sending the script and
reading its answer later lets that time do work the answer does not decide: reading the batch's
input while its begin is on its way, and taking the next message while the record is.

`SentScript` writes the script's call on a connection of its own from the client's pool and reads
the answer when asked (`answer`), or when the socket it waits on (`fileno`) turns readable. It
never gives up where a node would not: a call it could not send, or whose answer it could not
read (the connection broke, Redis lost the script in a failover), is made again the blocking way,
riding out Redis's absence (`until_answered`). Every store script carries a token per call, so a
call made again after the first one ran answers what the first run did.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from foundation.redis_clients import TRANSIENT_ERRORS, riding_out_stopped

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

UNTIL_ANSWERED_PAUSE_S = 1.0
# The exit status of a node that stopped while Redis was away (EX_TEMPFAIL: try again later).
EXIT_LEFT_WITHOUT_REDIS = 75


class Answer(Protocol[T_co]):
    """A store call's answer, maybe still on its way."""

    def fileno(self) -> int | None:
        """The socket the answer arrives on, to wait on without reading; None when it is known already."""

    def answer(self) -> T_co:
        """The answer, waited for if need be; asked once."""


class Answered(Generic[T]):
    """An answer known at once (a store without round trips, or a call that was not sent)."""

    def __init__(self, value: T) -> None:
        self._value = value

    def fileno(self) -> int | None:
        return None

    def answer(self) -> T:
        return self._value


class SentScript(Generic[T]):
    """A Redis script call sent now, its answer read later (see the module's docstring).

    The call is sent on a connection of `client`'s pool; made again the blocking way, it is
    `until_answered(what, ...)`. `convert` turns the raw reply into the answer, whichever way it came.
    """

    def __init__(self, client: redis.Redis, script: Script, keys: list[Any], args: list[Any], what: str,
                 convert: Callable[[Any], T]) -> None:
        self._pool = client.connection_pool
        self._script, self._keys, self._args, self._what = script, keys, args, what
        self._convert = convert
        self._connection: Any = None
        try:
            connection: Any = self._pool.get_connection()  # redis-py's connections are untyped
        except TRANSIENT_ERRORS:
            return  # made again when the answer is asked for
        try:
            connection.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except TRANSIENT_ERRORS:  # redis-py disconnected it; the call may not have reached Redis
            self._pool.release(connection)
            return
        except BaseException:
            connection.disconnect()
            self._pool.release(connection)
            raise
        self._connection = connection

    def fileno(self) -> int | None:
        sock = getattr(self._connection, "_sock", None)
        return sock.fileno() if sock is not None else None

    def answer(self) -> T:
        connection, self._connection = self._connection, None
        if connection is None:
            return self._convert(self._again())
        try:
            reply = connection.read_response()
        except NoScriptError:  # a server that lost its scripts (a promoted replica): the `Script` loads it again
            self._pool.release(connection)
            return self._convert(self._again())
        except TRANSIENT_ERRORS:  # the answer is lost, maybe not the call: made again, it answers as the first run did
            connection.disconnect()
            self._pool.release(connection)
            return self._convert(self._again())
        except BaseException:
            connection.disconnect()
            self._pool.release(connection)
            raise
        self._pool.release(connection)
        return self._convert(reply)

    def _again(self) -> Any:
        return until_answered(self._what, lambda: self._script(keys=self._keys, args=self._args))


def until_answered(what: str, call: Callable[[], T]) -> T:
    """`call()` until Redis answers, however long it is away.

    For a node holding a delivery (starting or recording a batch): giving up would let Celery
    acknowledge the message (it acknowledges failed tasks) and lose the batch, or throw away the
    outcome of work done; the node can do nothing else without Redis anyway. Each wait lasts the
    client's own retry window (`foundation/redis_clients.py`); `call` carries one token throughout, so a
    repeat is answered as the first run was.
    """
    while True:
        try:
            return call()
        except TRANSIENT_ERRORS as e:
            if riding_out_stopped():
                leave_without_redis(what, e)
            log.error("%s: Redis is still away (%s: %s); waiting for it", what, type(e).__name__, e)
            time.sleep(UNTIL_ANSWERED_PAUSE_S)


def leave_without_redis(what: str, error: Exception) -> NoReturn:
    """A node asked to stop while Redis is away: it ends now, as a killed node would, instead of waiting
    for a Redis that may never come back (its stack stopped it first, or it is gone for good).

    Nothing it holds is lost: its message stays unacknowledged in the broker, and its batch in its
    in-flight hash, so the batch is given back and run again once Redis is there (`jobs/transport/settle.py`,
    beat's lost-batch net), as after any node's death; a batch whose outcome was not recorded is run
    again, never counted twice (each store call carries its token)."""
    log.error("%s: Redis is away and this node is stopping, so it ends without waiting for Redis; the batch "
              "is given back and run again once Redis is there (%s: %s)", what, type(error).__name__, error)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_LEFT_WITHOUT_REDIS)
