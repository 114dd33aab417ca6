"""The records of AsyncAPI requests, in Redis: stored once, taken by nodes, ended exactly once.

Each change a node makes is one Lua script, so two copies of a request's message (a node died and
it was given back, or Redis re-delivered it) can never both record an outcome: `finish` moves a
request to `completed` or `failed` only from `in_queue` or `in_progress`, and tells exactly one
caller that it did. Records expire `retention_s` after their last change; the sorted set
`keys.ASYNC_EXPIRY` remembers when, so that beat removes what they left in storage too
(`beat/steps.py`). `MemoryAsyncRequests` (`jobs/memory_async.py`) keeps the same contract in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import redis

from foundation import keys
from foundation.figures import ASYNC_REQUESTS, ASYNC_SECONDS, label_field, le_label

from .async_counts import SLOT_TTL_S, AsyncCounts, counts_from, slot_of, window_slots
from .async_request import AsyncRequest, RequestStatus

# Every script that moves a request moves its API's counts (`keys.async_counts`) with it.

# Sets the record's fields unless it exists already; its expiry is remembered; one more queued.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('HINCRBY', KEYS[3], 'in_queue', 1)
return 1
"""

# A node takes the request: counted, and in progress unless it has ended (its status is returned).
_BEGIN = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', 0} end
if status ~= 'in_queue' and status ~= 'in_progress' then return {status, 0} end
redis.call('HSET', KEYS[1], 'status', 'in_progress', 'started', ARGV[1])
if status == 'in_queue' then
  redis.call('HINCRBY', KEYS[2], 'in_queue', -1)
  redis.call('HINCRBY', KEYS[2], 'in_progress', 1)
end
return {status, redis.call('HINCRBY', KEYS[1], 'deliveries', 1)}
"""

# The outcome, once: only a request still queued or in progress ends (1), any later call is 0.
# The one call that ends it counts it: out of its API's queued or in-progress count, into the
# slot of requests ended (`jobs/async_counts.py`), the outcome figure and the duration histogram
# (submission to now, both server times; `foundation/figures.py`'s stored form).
# KEYS: record, expiry set, counts, ended slot, outcome figure, duration figure.
# ARGV: expire seconds, expiry score, expiry member, now, status, outcome field, duration labels,
# slot expire seconds, then the fields to set.
_FINISH = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'in_queue' and status ~= 'in_progress' then return 0 end
local created = tonumber(redis.call('HGET', KEYS[1], 'created') or '')
redis.call('HSET', KEYS[1], unpack(ARGV, 9))
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


# Forgets an expired request; one whose record is still there unended leaves its API's counts.
_REMOVE = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'in_queue' or status == 'in_progress' then redis.call('HINCRBY', KEYS[3], status, -1) end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
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

    @property
    def runs(self) -> bool:
        """Whether the node is to run it (it has not ended)."""
        return self.status is not None and not self.status.is_terminal


class AsyncRequestStore(Protocol):
    """Where AsyncAPI requests are recorded."""

    retention_s: float

    def create(self, request: AsyncRequest, now: float) -> bool:
        """Store a new request; False (and nothing changed) when one of that id exists already."""

    def get(self, api_name: str, request_id: str) -> AsyncRequest | None:
        """The request's record; None when unknown or expired."""

    def begin(self, api_name: str, request_id: str, now: float) -> Taken:
        """A node takes the request: in progress unless it has ended."""

    def finish(self, api_name: str, request_id: str, status: RequestStatus, now: float, *,
               result_uri: str = "", message: str = "") -> bool:
        """Record the outcome; True for the one call that did, False once it has ended."""

    def expired(self, now: float, limit: int = 500) -> list[tuple[str, str]]:
        """(api name, request id) of requests whose retention has passed, oldest first."""

    def remove(self, api_name: str, request_id: str) -> None:
        """Forget an expired request (its record and its place in the expiry set)."""

    def counts(self, api_name: str, now: float) -> AsyncCounts:
        """The API's requests queued and in progress now, and ended in the last minute."""


def _expire_seconds(retention_s: float) -> int:
    return max(1, math.ceil(retention_s))


class RedisAsyncRequests:
    """`AsyncRequestStore` in Redis; the client is passed in."""

    def __init__(self, client: redis.Redis, retention_s: float) -> None:
        self._redis = client
        self.retention_s = retention_s
        self._create = client.register_script(_CREATE)
        self._begin = client.register_script(_BEGIN)
        self._finish = client.register_script(_with_buckets(_FINISH, ASYNC_SECONDS.buckets))
        self._remove = client.register_script(_REMOVE)

    def _expiry_args(self, api_name: str, request_id: str, now: float) -> list[str]:
        return [str(_expire_seconds(self.retention_s)), repr(now + self.retention_s),
                expiry_member(api_name, request_id)]

    def create(self, request: AsyncRequest, now: float) -> bool:
        fields: list[str | bytes] = []
        for name, value in request.to_dict().items():
            fields.extend((name, value))
        args = [*self._expiry_args(request.api_name, request.request_id, now), *fields]
        created = self._create(keys=[keys.async_request(request.api_name, request.request_id), keys.ASYNC_EXPIRY,
                                     keys.async_counts(request.api_name)], args=args)
        return bool(created)

    def get(self, api_name: str, request_id: str) -> AsyncRequest | None:
        raw = self._redis.hgetall(keys.async_request(api_name, request_id))
        if not raw or b"status" not in raw:
            return None
        return AsyncRequest.from_fields(api_name, request_id, raw)

    def begin(self, api_name: str, request_id: str, now: float) -> Taken:
        status, deliveries = self._begin(keys=[keys.async_request(api_name, request_id), keys.async_counts(api_name)],
                                         args=[repr(now)])
        text = status.decode() if isinstance(status, bytes) else str(status)
        return Taken(RequestStatus(text) if text else None, int(deliveries))

    def finish(self, api_name: str, request_id: str, status: RequestStatus, now: float, *,
               result_uri: str = "", message: str = "") -> bool:
        fields = ["status", status.value, "timestamp", repr(now)]
        if result_uri:
            fields += ["result_uri", result_uri]
        if message:
            fields += ["message", message]
        args = [*self._expiry_args(api_name, request_id, now), repr(now), status.value,
                label_field((api_name, status.value)), label_field((api_name,)), str(SLOT_TTL_S), *fields]
        return bool(self._finish(keys=[
            keys.async_request(api_name, request_id), keys.ASYNC_EXPIRY, keys.async_counts(api_name),
            keys.async_ended(api_name, slot_of(now)), ASYNC_REQUESTS.key, ASYNC_SECONDS.key,
        ], args=args))

    def expired(self, now: float, limit: int = 500) -> list[tuple[str, str]]:
        members = self._redis.zrangebyscore(keys.ASYNC_EXPIRY, "-inf", now, start=0, num=limit)
        return [parse_expiry_member(m.decode() if isinstance(m, bytes) else str(m)) for m in members]

    def remove(self, api_name: str, request_id: str) -> None:
        self._remove(keys=[keys.async_request(api_name, request_id), keys.ASYNC_EXPIRY, keys.async_counts(api_name)],
                     args=[expiry_member(api_name, request_id)])

    def counts(self, api_name: str, now: float) -> AsyncCounts:
        pipe = self._redis.pipeline(transaction=False)
        pipe.hgetall(keys.async_counts(api_name))
        for slot in window_slots(now):
            pipe.hgetall(keys.async_ended(api_name, slot))
        gauges, *slots = pipe.execute()
        return counts_from(gauges, slots)
