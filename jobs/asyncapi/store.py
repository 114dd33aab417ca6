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
from jobs.transport.delivery import Delivery, request_entry
from jobs.transport.task_messages import QueuedMessage

# A task for an API's queued requests that never started (the submitting process died before sending
# it) holds back the next one at most this long; beat's sweep also re-arms what it finds queued.
WAKE_TTL_S = 30
# Most unstarted requests `unstarted` answers at once (beat sends those again, a few at a time).
UNSTARTED_LIMIT = 500

# Every script that moves a request moves its API's counts (`keys.async_counts`) with it.

# Sets the record's fields unless it exists already; its expiry is remembered; one more queued; it is
# unstarted (KEYS[4]; ARGV[4] its id) after the newest there.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'in_queue', 1)
UNSTARTED(KEYS[4], ARGV[4])
return 1
"""

# Lua: the request `id` joins the unstarted set `key` after the newest there (the set keeps the order
# requests were stored in; scores restart from 1 once it is empty).
_UNSTARTED = """
local function UNSTARTED(key, id)
  local newest = redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')
  local score = 1
  if newest[2] then score = tonumber(newest[2]) + 1 end
  redis.call('ZADD', key, score, id)
end
"""

# A delivery (ARGV[2], its owner) takes the request: counted, and in progress unless it has ended or
# another owner holds it in progress (status, deliveries, held: 1 for that); a request taken comes
# with its record's fields (the node needs its payload: one round trip instead of two). With ARGV[3]
# (the delivery's in-flight entry), the delivery first enters its node's in-flight hash (KEYS[3]),
# whatever the request's state: the node's step of `jobs/nodes/registry.py` `begin_delivery`, in the same trip.
# A delivery finding the request (ARGV[4] its id) took its message: it is no longer unstarted (KEYS[4]).
_BEGIN = """
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[2], ARGV[3]) end
redis.call('ZREM', KEYS[4], ARGV[4])
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', 0, 0} end
if status ~= 'in_queue' and status ~= 'in_progress' then return {status, 0, 0} end
local owner = redis.call('HGET', KEYS[1], 'owner')
if status == 'in_progress' and owner and owner ~= '' and owner ~= ARGV[2] then return {status, 0, 1} end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'started', ARGV[1], 'owner', ARGV[2])
if status == 'in_queue' then
  redis.call('HINCRBY', KEYS[2], 'in_queue', -1)
  redis.call('HINCRBY', KEYS[2], 'in_progress', 1)
end
local taken = {status, redis.call('HINCRBY', KEYS[1], 'deliveries', 1), 0}
for _, value in ipairs(redis.call('HGETALL', KEYS[1])) do taken[#taken + 1] = value end
return taken
"""

# Up to ARGV[3] queued requests of the API (KEYS[1] its queued list, KEYS[2] the owner's claims,
# KEYS[3] the API's counts, KEYS[4] its unstarted set,
# ARGV[4] the record key's prefix) taken by the owner ARGV[2]: {id, deliveries, ...}. Ids of
# requests no longer queued (taken by their own delivery, ended, expired) are dropped from the list.
_CLAIM = """
local claimed = {}
local wanted = tonumber(ARGV[3])
while #claimed < 2 * wanted do
  local id = redis.call('RPOP', KEYS[1])
  if not id then break end
  local record = ARGV[4] .. id
  if redis.call('HGET', record, 'status') == 'in_queue' then
    redis.call('HSET', record, 'status', 'in_progress', 'started', ARGV[1], 'owner', ARGV[2])
    redis.call('SADD', KEYS[2], id)
    redis.call('ZREM', KEYS[4], id)
    redis.call('HINCRBY', KEYS[3], 'in_queue', -1)
    redis.call('HINCRBY', KEYS[3], 'in_progress', 1)
    claimed[#claimed + 1] = id
    claimed[#claimed + 1] = redis.call('HINCRBY', record, 'deliveries', 1)
  end
end
if #claimed > 0 then redis.call('EXPIRE', KEYS[2], ARGV[5]) end
return claimed
"""

# A request submitted: refused (-1) unless its API is registered (KEYS[4], field ARGV[4]; the API
# routed it by a view of the registry up to a second old), 0 when one of its id exists already, else
# created (`_CREATE`), its task's message (ARGV[8], when given) pushed on the broker's list (KEYS[7]),
# and, when ARGV[6] is '1' (`server_side_batching`), offered to batches at once
# (`_QUEUE`: 2 when the caller sends the task for the queued requests, else 1), else unstarted.
# KEYS: record, expiry set, counts, registry, queued list, wake key, the task's broker list, unstarted set.
# ARGV: expire seconds, expiry score, expiry member, api name, request id, queued, wake ttl, task
# message, fields.
_SUBMIT = """
if redis.call('HEXISTS', KEYS[4], ARGV[4]) == 0 then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 9))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'in_queue', 1)
if ARGV[8] ~= '' then redis.call('LPUSH', KEYS[7], ARGV[8]) end
if ARGV[6] ~= '1' then
  UNSTARTED(KEYS[8], ARGV[5])
  return 1
end
redis.call('LPUSH', KEYS[5], ARGV[5])
redis.call('EXPIRE', KEYS[5], ARGV[1])
if redis.call('SET', KEYS[6], '1', 'NX', 'EX', ARGV[7]) then return 2 end
return 1
"""

# A request offered to batches (KEYS[1] the API's queued list, KEYS[2] its wake key, KEYS[3] its
# unstarted set, which it leaves): 1 when no task for the queued requests is on its way (the caller
# sends one: the wake key is now set for it).
_QUEUE = """
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[3]) then return 1 end
return 0
"""

# After a batch: 1 when requests are still queued and no task for them is on its way (the caller sends one).
_REARM = """
if redis.call('LLEN', KEYS[1]) == 0 then return 0 end
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 1 end
return 0
"""

# The owner's claimed requests still in progress under it, taken again: {id, deliveries, ...}.
_RECLAIM = """
local taken = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local record = ARGV[3] .. id
  if redis.call('HGET', record, 'status') == 'in_progress' and redis.call('HGET', record, 'owner') == ARGV[2] then
    redis.call('HSET', record, 'started', ARGV[1])
    taken[#taken + 1] = id
    taken[#taken + 1] = redis.call('HINCRBY', record, 'deliveries', 1)
  end
end
return taken
"""

# The outcome, once: only a request still queued or in progress ends (1), any later call is 0.
# The one call that ends it counts it: out of its API's queued or in-progress count, into the
# slot of requests ended (`jobs/asyncapi/counts.py`), the outcome figure and the duration histogram
# (submission to now, both server times; `foundation/figures.py`'s stored form).
# With ARGV[9] (a delivery's task id), that delivery also leaves its node's in-flight hash (KEYS[7]),
# whether or not this call ends the request: its last step (`jobs/nodes/registry.py` `end_delivery`).
# An ended request is not unstarted (KEYS[8]).
# KEYS: record, expiry set, counts, ended slot, outcome figure, duration figure, in-flight hash,
# unstarted set.
# ARGV: expire seconds, expiry score, expiry member, now, status, outcome field, duration labels,
# slot expire seconds, ending delivery's task id, request id, then the fields to set.
_FINISH = """
if ARGV[9] ~= '' then redis.call('HDEL', KEYS[7], ARGV[9]) end
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'in_queue' and status ~= 'in_progress' then return 0 end
redis.call('ZREM', KEYS[8], ARGV[10])
local created = tonumber(redis.call('HGET', KEYS[1], 'created') or '')
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], status, -1)
redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
redis.call('EXPIRE', KEYS[4], ARGV[8])
redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
if created then
  local seconds = math.max(0, tonumber(ARGV[4]) - created)
  local le = '+Inf'
  for i = 1, #BOUNDS do
    if seconds <= BOUNDS[i] then le = LES[i]; break end
  end
  redis.call('HINCRBY', KEYS[6], ARGV[7] .. '|' .. le, 1)
  redis.call('HINCRBYFLOAT', KEYS[6], ARGV[7] .. '|sum', tostring(seconds))
end
return 1
"""


def _with_buckets(script: str, bounds: tuple[float, ...]) -> str:
    """The script with the histogram's bucket bounds (as numbers, and as their stored `le` fields)."""
    numbers = ", ".join(repr(float(b)) for b in bounds)
    fields = ", ".join(f"'{le_label(b)}'" for b in bounds)
    return f"local BOUNDS = {{{numbers}}}\nlocal LES = {{{fields}}}\n{script}"


# Forgets an expired request (ARGV[2] its id); one whose record is still there unended leaves its API's
# counts, and its unstarted set (KEYS[4]).
_REMOVE = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'in_queue' or status == 'in_progress' then redis.call('HINCRBY', KEYS[3], status, -1) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""

# The oldest unstarted requests (KEYS[1]) beyond as many as there are messages on the API's queue
# (KEYS[2..], its lists), at most ARGV[1]: read in one step, so that no message moves between the counts.
_UNSTARTED_BEYOND_QUEUE = """
local waiting = redis.call('ZCARD', KEYS[1])
local messages = 0
for i = 2, #KEYS do messages = messages + redis.call('LLEN', KEYS[i]) end
local beyond = math.min(waiting - messages, tonumber(ARGV[1]))
if beyond <= 0 then return {} end
return redis.call('ZRANGE', KEYS[1], 0, beyond - 1)
"""


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
               message: QueuedMessage | None = None) -> Submitted:
        """`create` for a request its API's route sent, refused with `ApiNotFound` unless the API is
        still registered; `queued`: also offer it to batches at once (as `queue`), in the same step;
        `message`: the task that runs it, queued in the same step too, only if the request is stored
        (the broker being this Redis)."""

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
        self._create = client.register_script(_UNSTARTED + _CREATE)
        self._begin = client.register_script(_BEGIN)
        self._finish = client.register_script(_with_buckets(_FINISH, ASYNC_SECONDS.buckets))
        self._remove = client.register_script(_REMOVE)
        self._claim = client.register_script(_CLAIM)
        self._reclaim = client.register_script(_RECLAIM)
        self._queue = client.register_script(_QUEUE)
        self._submit = client.register_script(_UNSTARTED + _SUBMIT)
        self._unstarted = client.register_script(_UNSTARTED_BEYOND_QUEUE)
        self._rearm = client.register_script(_REARM)

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
               message: QueuedMessage | None = None) -> Submitted:
        api_name, request_id = request.api_name, request.request_id
        fields: list[str | bytes] = []
        for name, value in request.to_dict().items():
            fields.extend((name, value))
        args = [*self._expiry_args(api_name, request_id, now), api_name, request_id, "1" if queued else "0",
                WAKE_TTL_S, message.payload if message is not None else "", *fields]
        done = int(self._submit(keys=[keys.async_request(api_name, request_id), keys.ASYNC_EXPIRY,
                                      keys.async_counts(api_name), keys.APIS, keys.async_queued(api_name),
                                      # With no message, KEYS[7] is a key the script reads anyway (pushed nothing).
                                      keys.async_wake(api_name), message.key if message is not None else keys.APIS,
                                      keys.async_unstarted(api_name)],
                                args=args))
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
        """`_FINISH` for one outcome, called on `client` when given (a pipeline: queued, answered by its execute)."""
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
