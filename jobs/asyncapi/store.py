"""The records of AsyncAPI requests, in Redis: stored once, taken by nodes, ended exactly once.

Each change a node makes is one Lua script, so two copies of a request's message (a node died and
it was given back, or Redis re-delivered it) can never both record an outcome: `finish` moves a
request to `completed` or `failed` only from `in_queue` or `in_progress`, and tells exactly one
caller that it did. Records expire `retention_s` after their last change; the sorted set
`keys.ASYNC_EXPIRY` remembers when, so that beat removes what they left in storage too
(`beat/steps.py`). `MemoryAsyncRequests` (`jobs/asyncapi/memory.py`) keeps the same contract in memory
(tests/contracts/async_store.py runs on both).

Each request is taken by one delivery, its `owner` (the task id of the Celery message running it):
another delivery finding it in progress under another owner leaves it alone. With
`server_side_batching`, a request is also pushed on its API's queued list (`queue`), and a delivery claims
queued requests from there into its own batch (`claim`); they stay recorded under its task id,
so that if its node dies, its message comes back and takes them again (`reclaim`).

A delivery of one request also enters its node's in-flight hash in `begin`'s script and leaves it in
`finish`'s (`node`, `ending`), as a batch does in the batch ledger's scripts: the two steps of
`jobs/nodes/registry.py` that would otherwise cost a round trip each per request, with what settling a dead
node reads (`jobs/transport/settle.py`) unchanged. Likewise `submit` pushes the request's task message on the
broker's list (`jobs/transport/task_messages.py`) in the script that stores it: queued if and only if stored.

A request stored without being offered to batches waits in its API's unstarted set
(`keys.async_unstarted`), in the order stored, until a delivery takes it, a batch claims it, it is
offered to batches or it ends. Its message can still go missing after that script: an API process
that dies before sending one through Celery (on a broker transport whose messages it cannot make),
a node killed between taking the message off the queue and `begin`. Since the queue hands messages out oldest
first, when the set holds N requests and the API's queue L messages, the oldest N - L of them have
had their messages taken off the queue (`unstarted`); one that stays so while beat looks for a
while is sent again (beat/lost_requests.py). `begin` keeps a second message harmless.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import redis

from foundation import keys
from foundation.api_registry import not_deployed
from foundation.figures import ASYNC_REQUESTS, ASYNC_SECONDS, label_field, le_label
from foundation.redis_clients import text
from jobs.asyncapi.counts import SLOT_TTL_S, AsyncCounts, counts_from, slot_of, window_slots
from jobs.asyncapi.request import AsyncRequest, RequestStatus
from jobs.lua_scripts import lua_source
from jobs.transport.delivery import Delivery, request_entry
from jobs.transport.task_messages import QueuedMessage

# A task for an API's queued requests that never started (the submitting process died before sending
# it) holds back the next one at most this long; beat's sweep also re-arms what it finds queued.
WAKE_TTL_S = 30
# Most unstarted requests `unstarted` answers at once (beat sends those again, a few at a time).
UNSTARTED_LIMIT = 500

# Every script (`lua/`) that moves a request moves its API's counts (`keys.async_counts`) with it.


def _with_buckets(script: str, bounds: tuple[float, ...]) -> str:
    """The script with the histogram's bucket bounds (as numbers, and as their stored `le` fields)."""
    numbers = ", ".join(repr(float(b)) for b in bounds)
    fields = ", ".join(f"'{le_label(b)}'" for b in bounds)
    return f"local BOUNDS = {{{numbers}}}\nlocal LES = {{{fields}}}\n{script}"


def source(name: str) -> str:
    """One of the store's scripts, `lua/<name>.lua` (each moves a request and its API's counts together)."""
    return lua_source("jobs.asyncapi", name)


def expiry_member(api_name: str, request_id: str) -> str:
    """A request's member of `keys.ASYNC_EXPIRY`."""
    return f"{api_name}/{request_id}"


def parse_expiry_member(member: str) -> tuple[str, str]:
    api_name, _, request_id = member.partition("/")
    return api_name, request_id


@dataclass(frozen=True)
class Taken:
    """What a node learns when it takes a request: its status before, and how many times it was taken."""

    status: RequestStatus | None  # None: no such request (never stored, or expired)
    deliveries: int
    held: bool = False  # in progress under another delivery (claimed into its batch)
    request: AsyncRequest | None = None  # its record as taken, when it `runs`

    @property
    def runs(self) -> bool:
        """Whether the node is to run it (it has not ended, and no other delivery holds it)."""
        return self.status is not None and not self.status.is_terminal and not self.held


@dataclass(frozen=True)
class Outcome:
    """One request's outcome, as `finish_many` records it (the arguments of `finish`)."""

    request_id: str
    status: RequestStatus
    result: bytes | None = None
    result_uri: str = ""
    message: str = ""


class RouteChanged(Exception):
    """A submission routed by a registry generation that is no longer the registry's: nothing was
    stored, and the caller reads the route again (a deploy or delete may have changed it)."""


@dataclass(frozen=True)
class Submitted:
    """What `submit` did: stored the request (False: one of that id was there already), and whether the
    caller is to send the task for the API's queued requests (none is on its way)."""

    created: bool
    wake: bool = False


class AsyncRequestStore(Protocol):
    """Where AsyncAPI requests are recorded."""

    retention_s: float

    def create(self, request: AsyncRequest, now: float) -> bool:
        """Store a new request; False (and nothing changed) when one of that id exists already."""

    def submit(self, request: AsyncRequest, now: float, *, queued: bool = False,
               message: QueuedMessage | None = None, generation: int | None = None) -> Submitted:
        """`create` for a request its API's route sent, refused with `ApiNotFound` unless the API is
        still registered; `queued`: also offer it to batches at once (as `queue`), in the same step;
        `message`: the task that runs it, queued in the same step too, only if the request is stored
        (the broker being this Redis); `generation`: the registry generation the route was read at,
        refused with `RouteChanged` (nothing stored) unless the registry is still at it."""

    def queue(self, api_name: str, request_id: str) -> bool:
        """Offer a stored request (its payload stored too) to `claim` (`server_side_batching`); True
        when no task for the API's queued requests is on its way: the caller sends one (`wake`)."""

    def send(self, message: QueuedMessage) -> None:
        """Push a task's message on the broker's list (the broker being this Redis), without Celery."""

    def woken(self, api_name: str) -> None:
        """A task for the API's queued requests has started: the next request queued sends another."""

    def rearm(self, api_name: str) -> bool:
        """True when requests are still queued and no task for them is on its way: the caller sends one."""

    def get(self, api_name: str, request_id: str) -> AsyncRequest | None:
        """The request's record; None when unknown or expired."""

    def get_many(self, api_name: str, request_ids: Sequence[str]) -> dict[str, AsyncRequest]:
        """The records of those requests still kept, by id (one round trip for a batch)."""

    def begin(self, api_name: str, request_id: str, now: float, owner: str = "", node: str = "") -> Taken:
        """The delivery `owner` takes the request: in progress unless it has ended or another owner
        holds it in progress (`held`); an owner taking it again (its message came back) runs it.
        `node`: the node running `owner`, whose in-flight hash the delivery enters in the same step,
        whatever the request's state (`NodeRegistry.begin_delivery` with its `request_entry`, one
        round trip fewer per request)."""

    def claim(self, api_name: str, owner: str, limit: int, now: float) -> list[tuple[str, int]]:
        """Up to `limit` of the API's queued requests (oldest first) taken into `owner`'s batch:
        (request id, deliveries)."""

    def reclaim(self, api_name: str, owner: str, now: float) -> list[tuple[str, int]]:
        """Those of `owner`'s claimed requests still in progress under it, taken again (its node died)."""

    def release(self, api_name: str, owner: str) -> None:
        """`owner`'s batch has ended: forget what it claimed."""

    def finish(self, api_name: str, request_id: str, status: RequestStatus, now: float, *,
               result: bytes | None = None, result_uri: str = "", message: str = "",
               ending: Delivery | None = None) -> bool:
        """Record the outcome (a small result inline, a large one by where it is stored); True for the
        one call that did, False once it has ended. `ending`: a delivery whose last step this is; it
        leaves its node's in-flight hash in the same step, whether or not this call ends the request
        (`NodeRegistry.end_delivery`, one round trip fewer per request)."""

    def finish_many(self, api_name: str, outcomes: Sequence[Outcome], now: float) -> list[bool]:
        """The outcomes of a batch's requests, each recorded as `finish` records it, in one round trip;
        for each, True when this call ended it."""

    def expired(self, now: float, limit: int = 500) -> list[tuple[str, str]]:
        """(api name, request id) of requests whose retention has passed, oldest first."""

    def remove(self, api_name: str, request_id: str) -> None:
        """Forget an expired request (its record and its place in the expiry set)."""

    def counts(self, api_name: str, now: float) -> AsyncCounts:
        """The API's requests queued and in progress now, and ended in the last minute."""

    def unstarted(self, api_name: str, queue_lists: Sequence[str], limit: int = UNSTARTED_LIMIT) -> list[str]:
        """The oldest of the API's requests stored with a message of their own (or not yet offered to
        batches) that no delivery has taken, beyond as many as there are messages on the API's queue
        (`queue_lists`: its lists in the broker, this Redis): their messages have left the queue
        without a node taking them yet, or never reached it. At most `limit`, oldest first."""


def _pairs(flat: list[bytes | str | int]) -> list[tuple[str, int]]:
    """A Lua script's {id, deliveries, id, deliveries, ...} as pairs."""
    ids = [text(v) for v in flat[0::2]]
    return list(zip(ids, (int(d) for d in flat[1::2]), strict=True))


def _expire_seconds(retention_s: float) -> int:
    return max(1, math.ceil(retention_s))


class RedisAsyncRequests:
    """`AsyncRequestStore` in Redis; the client is passed in."""

    def __init__(self, client: redis.Redis, retention_s: float) -> None:
        self._redis = client
        self.retention_s = retention_s
        self._create = client.register_script(source("unstarted") + source("create"))
        self._begin = client.register_script(source("begin"))
        self._finish = client.register_script(_with_buckets(source("finish"), ASYNC_SECONDS.buckets))
        self._remove = client.register_script(source("remove"))
        self._claim = client.register_script(source("claim"))
        self._reclaim = client.register_script(source("reclaim"))
        self._queue = client.register_script(source("queue"))
        self._submit = client.register_script(source("unstarted") + source("submit"))
        self._unstarted = client.register_script(source("unstarted_beyond_queue"))
        self._rearm = client.register_script(source("rearm"))

    def _expiry_args(self, api_name: str, request_id: str, now: float) -> list[str]:
        return [str(_expire_seconds(self.retention_s)), repr(now + self.retention_s),
                expiry_member(api_name, request_id)]

    def create(self, request: AsyncRequest, now: float) -> bool:
        fields: list[str | bytes] = []
        for name, value in request.to_dict().items():
            fields.extend((name, value))
        args = [*self._expiry_args(request.api_name, request.request_id, now), request.request_id, *fields]
        created = self._create(keys=[keys.async_request(request.api_name, request.request_id), keys.ASYNC_EXPIRY,
                                     keys.async_counts(request.api_name), keys.async_unstarted(request.api_name)],
                               args=args)
        return bool(created)

    def submit(self, request: AsyncRequest, now: float, *, queued: bool = False,
               message: QueuedMessage | None = None, generation: int | None = None) -> Submitted:
        api_name, request_id = request.api_name, request.request_id
        fields: list[str | bytes] = []
        for name, value in request.to_dict().items():
            fields.extend((name, value))
        args = [*self._expiry_args(api_name, request_id, now), api_name, request_id, "1" if queued else "0",
                WAKE_TTL_S, message.payload if message is not None else "",
                "" if generation is None else str(generation), *fields]
        done = int(self._submit(keys=[keys.async_request(api_name, request_id), keys.ASYNC_EXPIRY,
                                      keys.async_counts(api_name), keys.APIS, keys.async_queued(api_name),
                                      # With no message, KEYS[7] is a key the script reads anyway (pushed nothing).
                                      keys.async_wake(api_name), message.key if message is not None else keys.APIS,
                                      keys.async_unstarted(api_name), keys.APIS_GENERATION],
                                args=args))
        if done == -2:
            raise RouteChanged(api_name)
        if done < 0:
            raise not_deployed(api_name)
        return Submitted(created=done > 0, wake=done == 2)

    def queue(self, api_name: str, request_id: str) -> bool:
        return bool(self._queue(keys=[keys.async_queued(api_name), keys.async_wake(api_name),
                                      keys.async_unstarted(api_name)],
                                args=[request_id, _expire_seconds(self.retention_s), WAKE_TTL_S]))

    def send(self, message: QueuedMessage) -> None:
        self._redis.lpush(message.key, message.payload)

    def woken(self, api_name: str) -> None:
        self._redis.delete(keys.async_wake(api_name))

    def rearm(self, api_name: str) -> bool:
        return bool(self._rearm(keys=[keys.async_queued(api_name), keys.async_wake(api_name)], args=[WAKE_TTL_S]))

    def get(self, api_name: str, request_id: str) -> AsyncRequest | None:
        raw = self._redis.hgetall(keys.async_request(api_name, request_id))
        if not raw or b"status" not in raw:
            return None
        return AsyncRequest.from_fields(api_name, request_id, raw)

    def get_many(self, api_name: str, request_ids: Sequence[str]) -> dict[str, AsyncRequest]:
        pipe = self._redis.pipeline(transaction=False)
        for request_id in request_ids:
            pipe.hgetall(keys.async_request(api_name, request_id))
        return {request_id: AsyncRequest.from_fields(api_name, request_id, raw)
                for request_id, raw in zip(request_ids, pipe.execute(), strict=True) if raw and b"status" in raw}

    def begin(self, api_name: str, request_id: str, now: float, owner: str = "", node: str = "") -> Taken:
        entry = request_entry(api_name, request_id) if node and owner else ""
        status, deliveries, held, *fields = self._begin(
            keys=[keys.async_request(api_name, request_id), keys.async_counts(api_name), keys.inflight(node),
                  keys.async_unstarted(api_name)],
            args=[repr(now), owner, entry, request_id])
        taken_status = RequestStatus(text(status)) if status else None
        record = None
        if fields:
            record = AsyncRequest.from_fields(api_name, request_id, dict(zip(fields[0::2], fields[1::2], strict=True)))
        return Taken(taken_status, int(deliveries), held=bool(held), request=record)

    def _record_prefix(self, api_name: str) -> str:
        return keys.async_request(api_name, "")

    def claim(self, api_name: str, owner: str, limit: int, now: float) -> list[tuple[str, int]]:
        if limit <= 0:
            return []
        flat = self._claim(keys=[keys.async_queued(api_name), keys.async_claims(api_name, owner),
                                 keys.async_counts(api_name), keys.async_unstarted(api_name)],
                           args=[repr(now), owner, limit, self._record_prefix(api_name),
                                 _expire_seconds(self.retention_s)])
        return _pairs(flat)

    def reclaim(self, api_name: str, owner: str, now: float) -> list[tuple[str, int]]:
        flat = self._reclaim(keys=[keys.async_claims(api_name, owner)],
                             args=[repr(now), owner, self._record_prefix(api_name)])
        return _pairs(flat)

    def release(self, api_name: str, owner: str) -> None:
        self._redis.delete(keys.async_claims(api_name, owner))

    def finish(self, api_name: str, request_id: str, status: RequestStatus, now: float, *,
               result: bytes | None = None, result_uri: str = "", message: str = "",
               ending: Delivery | None = None) -> bool:
        outcome = Outcome(request_id, status, result=result, result_uri=result_uri, message=message)
        return bool(self._finish_one(api_name, outcome, now, ending))

    def finish_many(self, api_name: str, outcomes: Sequence[Outcome], now: float) -> list[bool]:
        pipe = self._redis.pipeline(transaction=False)
        for outcome in outcomes:
            self._finish_one(api_name, outcome, now, None, pipe)
        return [bool(done) for done in pipe.execute()] if outcomes else []

    def _finish_one(self, api_name: str, outcome: Outcome, now: float, ending: Delivery | None,
                    client: redis.client.Pipeline | None = None) -> object:
        """The finish script (`lua/finish.lua`) for one outcome, called on `client` when given (a
        pipeline: queued, answered by its execute)."""
        request_id, status = outcome.request_id, outcome.status
        fields: list[str | bytes] = ["status", status.value, "timestamp", repr(now)]
        if outcome.result is not None:
            fields += ["result", outcome.result]
        if outcome.result_uri:
            fields += ["result_uri", outcome.result_uri]
        if outcome.message:
            fields += ["message", outcome.message]
        args = [*self._expiry_args(api_name, request_id, now), repr(now), status.value,
                label_field((api_name, status.value)), label_field((api_name,)), str(SLOT_TTL_S),
                ending.task_id if ending is not None else "", request_id, *fields]
        return self._finish(keys=[
            keys.async_request(api_name, request_id), keys.ASYNC_EXPIRY, keys.async_counts(api_name),
            keys.async_ended(api_name, slot_of(now)), ASYNC_REQUESTS.key, ASYNC_SECONDS.key,
            keys.inflight(ending.node if ending is not None else ""), keys.async_unstarted(api_name),
        ], args=args, client=client)

    def expired(self, now: float, limit: int = 500) -> list[tuple[str, str]]:
        members = self._redis.zrangebyscore(keys.ASYNC_EXPIRY, "-inf", now, start=0, num=limit)
        return [parse_expiry_member(text(m)) for m in members]

    def remove(self, api_name: str, request_id: str) -> None:
        self._remove(keys=[keys.async_request(api_name, request_id), keys.ASYNC_EXPIRY, keys.async_counts(api_name),
                           keys.async_unstarted(api_name)],
                     args=[expiry_member(api_name, request_id), request_id])

    def unstarted(self, api_name: str, queue_lists: Sequence[str], limit: int = UNSTARTED_LIMIT) -> list[str]:
        found = self._unstarted(keys=[keys.async_unstarted(api_name), *queue_lists], args=[limit])
        return [text(v) for v in found]

    def counts(self, api_name: str, now: float) -> AsyncCounts:
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(keys.async_counts(api_name))
        for slot in window_slots(now):
            pipe.hgetall(keys.async_ended(api_name, slot))
        gauges, *slots = pipe.execute()
        return counts_from(gauges, slots)
