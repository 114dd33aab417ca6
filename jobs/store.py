"""The job store: job records, statuses and per-batch outcomes in Redis.

Batch outcomes are recorded idempotently (a batch index is counted once, whichever worker
reports it, however often its message is delivered), and status changes are guarded so that a
terminal status is never overwritten: both are small Lua scripts, so each is one round trip.

Every call may reach Redis more than once: the client sends a command again when its reply did
not come (`foundation/redis_clients.py`), and a stalled Redis runs the first copy too when it wakes up.
So each script that answers something only one caller may hear (this transition moved the job,
this record completed it, this caller may run `on_job_complete`) takes a token made once per
call, remembers it with the change, and answers a repeat carrying the same token as it answered
the first run, not as if it were someone else.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, Callable, Iterable, TypeVar

import redis

from foundation.errors import JobNotFound

from foundation import keys
from foundation.figures import ENDED_JOBS
from .job import ACTIVE_STATUSES, Job, JobStatus
from .nodes import Delivery, inflight_entry
from foundation.redis_clients import TRANSIENT_ERRORS

log = logging.getLogger(__name__)

T = TypeVar("T")
UNTIL_ANSWERED_PAUSE_S = 1.0

# KEYS: job hash, the figure of ended jobs. ARGV: new status, end time ('' for none), message, token,
# allowed current statuses... A job that ends is counted in the figure (`foundation/figures.py`) here,
# so exactly once whichever process ends it.
_TRANSITION = """
local current = redis.call('HGET', KEYS[1], 'status')
if not current then return 0 end
if current == ARGV[1] and redis.call('HGET', KEYS[1], 'moved_by') == ARGV[4] then return 1 end
for i = 5, #ARGV do
  if ARGV[i] == current then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], 'moved_by', ARGV[4])
    if ARGV[2] ~= '' then
      redis.call('HSET', KEYS[1], 'end_time', ARGV[2])
      local ok, record = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'record') or '')
      local api = (ok and type(record) == 'table' and record['api_name']) or ''
      redis.call('HINCRBY', KEYS[2], cjson.encode({tostring(api), (string.gsub(ARGV[1], '^status_', ''))}), 1)
    end
    if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'message', ARGV[3]) end
    return 1
  end
end
return 0
"""

# KEYS: job hash, done set, starts hash, the node's in-flight hash.
# ARGV: batch index, task id ('' for none), in-flight entry, token, active statuses...
# Returns {status, already recorded (0/1), deliveries of this batch so far}; deliveries are
# counted only while the job is active, so an ended job gains no key, and a repeat of the same
# call is not counted again. A batch that will run is entered in its node's in-flight hash under
# its task id (see `jobs/placement.py`).
_BEGIN_BATCH = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', 0, 0} end
local done = redis.call('SISMEMBER', KEYS[2], ARGV[1])
local starts = 0
for i = 5, #ARGV do
  if ARGV[i] == status then
    local token_field = ARGV[1] .. ':by'
    if redis.call('HGET', KEYS[3], token_field) == ARGV[4] then
      starts = tonumber(redis.call('HGET', KEYS[3], ARGV[1]))
    else
      starts = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
      redis.call('HSET', KEYS[3], token_field, ARGV[4])
    end
  end
end
if starts > 0 and done == 0 and ARGV[2] ~= '' then redis.call('HSET', KEYS[4], ARGV[2], ARGV[3]) end
return {status, done, starts}
"""

# KEYS: job hash, done set, failed hash, the node's in-flight hash, the job's kept payloads.
# ARGV: index, 'ok'|'failed', seconds, failure json, task id ('' for none), token, now.
# Returns 0 for a batch already recorded, 1 once recorded, 2 when this record was the last one of
# a sealed job: the caller alone then sends the job's completion task (a repeat of that very call,
# same token, is told 2 again: its first reply may never have reached it).
_RECORD_BATCH = """
if ARGV[5] ~= '' then redis.call('HDEL', KEYS[4], ARGV[5]) end
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 0 end
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  if redis.call('HGET', KEYS[1], 'finishing') == ARGV[6] then return 2 end
  return 0
end
redis.call('HDEL', KEYS[5], ARGV[1])
if ARGV[2] == 'ok' then
  redis.call('HINCRBY', KEYS[1], 'succeeded', 1)
else
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
end
redis.call('HINCRBYFLOAT', KEYS[1], 'time_total', ARGV[3])
-- A batch finishing after its job ended must not leave keys that never expire.
local ttl = redis.call('TTL', KEYS[1])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[2], ttl)
  if ARGV[2] ~= 'ok' then redis.call('EXPIRE', KEYS[3], ttl) end
end
local total = redis.call('HGET', KEYS[1], 'sealed_total')
if total and redis.call('SCARD', KEYS[2]) >= tonumber(total) then
  if redis.call('HSETNX', KEYS[1], 'finishing', ARGV[6]) == 1 then
    redis.call('HSET', KEYS[1], 'finishing_at', ARGV[7])
    return 2
  end
end
return 1
"""

# KEYS: job hash, done set. ARGV: total batch count, token, now.
# Seals the job's batch count once enqueueing is over; returns 1 when every batch is already
# recorded (then the caller sends the completion task), else 0.
_SEAL = """
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 0 end
redis.call('HSET', KEYS[1], 'sealed_total', ARGV[1])
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[1]) then
  if redis.call('HSETNX', KEYS[1], 'finishing', ARGV[2]) == 1 then
    redis.call('HSET', KEYS[1], 'finishing_at', ARGV[3])
    return 1
  end
  if redis.call('HGET', KEYS[1], 'finishing') == ARGV[2] then return 1 end
end
return 0
"""

# KEYS: job hash. ARGV: claim token ("<task id>/<nonce>"), task id ('' for none).
# Who may run a job's `on_job_complete`: the first claimant, and a repeat of its own call. Later
# claimants learn whether the hook already ran ('ran': settle the job's status), whether an
# earlier delivery of their very task claimed it and died ('died': it may or may not have run,
# and it is never run twice), or whether someone else holds it now ('busy').
_CLAIM_COMPLETION = """
if redis.call('HEXISTS', KEYS[1], 'record') == 0 then return 'gone' end
local current = redis.call('HGET', KEYS[1], 'completing')
if not current then
  redis.call('HSET', KEYS[1], 'completing', ARGV[1])
  return 'claimed'
end
if redis.call('HEXISTS', KEYS[1], 'hook_done') == 1 then return 'ran' end
if current == ARGV[1] then return 'claimed' end
if ARGV[2] ~= '' and string.sub(current, 1, #ARGV[2] + 1) == ARGV[2] .. '/' then return 'died' end
return 'busy'
"""


def _until_answered(what: str, call: Callable[[], T]) -> T:
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
            log.error("%s: Redis is still away (%s: %s); waiting for it", what, type(e).__name__, e)
            time.sleep(UNTIL_ANSWERED_PAUSE_S)


class Recorded(IntEnum):
    """What recording a batch outcome did."""

    DUPLICATE = 0  # already counted: a redelivery
    COUNTED = 1
    COMPLETED_JOB = 2  # the last batch of a sealed job: send its completion task

    def __bool__(self) -> bool:
        return self is not Recorded.DUPLICATE


class Claim(str, Enum):
    """What asking to run a job's `on_job_complete` got (see `_CLAIM_COMPLETION`)."""

    CLAIMED = "claimed"  # run it
    RAN = "ran"  # it has run: only the job's final status is left to settle
    DIED = "died"  # an earlier delivery of this same task claimed it and died: never run it again
    BUSY = "busy"  # another delivery holds it now
    GONE = "gone"  # the job's record is gone


def new_token() -> str:
    """A token for one call: a repeat of that call carries it, no other call does."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class BatchStart:
    """What a worker learns when it picks up a batch."""

    status: JobStatus | None
    already_recorded: bool
    deliveries: int


@dataclass(frozen=True)
class JobState:
    """The moving parts of a job, read in one go."""

    job: Job
    status: JobStatus
    succeeded: int
    failed: int
    time_total: float
    end_time: float | None
    message: str
    nodes: list[str]
    # When every batch was recorded (the completion task was then due); None before.
    finishing_at: float | None = None
    completion_claimed: bool = False
    # `on_job_complete` has run; its problem, if it raised ('' if not), else None.
    hook_message: str | None = None
    completion_resent_at: float | None = None
    # How many batches the job has, fixed once all were published (None while enqueueing).
    sealed_total: int | None = None

    @property
    def all_recorded(self) -> bool:
        return self.finishing_at is not None

    @property
    def batches_in_queue(self) -> int:
        if self.status.is_terminal:
            return 0
        return max(self.job.total_batch_count - self.succeeded - self.failed, 0)

    @property
    def average_time_per_batch(self) -> float | None:
        done = self.succeeded + self.failed
        return self.time_total / done if done else None



def failed_batch_record(index: int, error: str, tries: int, payload: Any,
                        payload_ref: dict[str, Any] | None = None) -> str:
    """What is kept of a failed batch (its error, tries, and its items or where they live), as stored."""
    record = {"index": index, "error": error, "tries": tries, "payload": payload}
    if payload_ref is not None:
        record["payload_ref"] = payload_ref
    return json.dumps(record, default=str)

class JobStore:
    """Job records and batch outcomes in Redis; the client is passed in, never found globally.

    Nodes (heartbeats, in-flight deliveries, giving them back) are `jobs/nodes.py`'s; only the
    scripts that begin and record a batch touch a node's in-flight hash, so that a batch leaves
    it in the same step as its outcome is counted. Key names are `foundation/keys.py`'s.
    """

    def __init__(self, client: redis.Redis, job_ttl_s: float = 7 * 24 * 3600) -> None:
        self._redis = client
        self._job_ttl_s = int(job_ttl_s)
        self._transition = client.register_script(_TRANSITION)
        self._begin_batch = client.register_script(_BEGIN_BATCH)
        self._record_batch = client.register_script(_RECORD_BATCH)
        self._seal = client.register_script(_SEAL)
        self._claim_completion = client.register_script(_CLAIM_COMPLETION)

    # -- keys (all named in foundation/keys.py) ---------------------------------------------------
    _job_key = staticmethod(keys.job)
    _keys_of = staticmethod(keys.job_keys)
    _api_jobs_key = staticmethod(keys.api_jobs)
    _ACTIVE_KEY = keys.ACTIVE_JOBS

    # -- jobs -------------------------------------------------------------------------------
    def create(self, job: Job, status: JobStatus = JobStatus.ENQUEUING) -> None:
        """Write a new job record and index it under its API and among the active jobs."""
        pipe = self._redis.pipeline()
        pipe.hset(
            self._job_key(job.job_id),
            mapping={
                "record": json.dumps(job.to_dict()),
                "status": status.value,
                "succeeded": 0,
                "failed": 0,
                "time_total": 0,
                "nodes": "[]",
                "enqueue_seen": job.start_time,
            },
        )
        pipe.zadd(self._api_jobs_key(job.api_name), {job.job_id: job.start_time})
        pipe.sadd(self._ACTIVE_KEY, job.job_id)
        pipe.execute()

    def get(self, job_id: str, api_name: str | None = None) -> Job:
        raw = self._redis.hget(self._job_key(job_id), "record")
        if raw is None:
            raise JobNotFound(f"job {job_id} not found" + (f" for api {api_name}" if api_name else ""))
        job = Job.from_dict(json.loads(raw))
        if api_name is not None and job.api_name != api_name:
            raise JobNotFound(f"job {job_id} not found for api {api_name}")
        return job

    def state(self, job_id: str, api_name: str | None = None) -> JobState:
        fields = self._redis.hgetall(self._job_key(job_id))
        if not fields:
            raise JobNotFound(f"job {job_id} not found" + (f" for api {api_name}" if api_name else ""))
        fields = {k.decode(): v.decode() for k, v in fields.items()}
        job = Job.from_dict(json.loads(fields["record"]))
        if api_name is not None and job.api_name != api_name:
            raise JobNotFound(f"job {job_id} not found for api {api_name}")
        end_time = fields.get("end_time")
        finishing_at, resent_at = fields.get("finishing_at"), fields.get("completion_resent_at")
        sealed_total = fields.get("sealed_total")
        return JobState(
            job=job,
            status=JobStatus(fields["status"]),
            succeeded=int(fields.get("succeeded", 0)),
            failed=int(fields.get("failed", 0)),
            time_total=float(fields.get("time_total", 0)),
            end_time=float(end_time) if end_time else None,
            message=fields.get("message", ""),
            nodes=json.loads(fields.get("nodes", "[]")),
            finishing_at=float(finishing_at) if finishing_at else None,
            completion_claimed="completing" in fields,
            hook_message=fields.get("hook_done"),
            completion_resent_at=float(resent_at) if resent_at else None,
            sealed_total=int(sealed_total) if sealed_total else None,
        )

    def status(self, job_id: str) -> JobStatus | None:
        raw = self._redis.hget(self._job_key(job_id), "status")
        return JobStatus(raw.decode()) if raw is not None else None

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]:
        pipe = self._redis.pipeline()
        for job_id in job_ids:
            pipe.hget(self._job_key(job_id), "status")
        return {
            job_id: JobStatus(raw.decode()) if raw is not None else None
            for job_id, raw in zip(job_ids, pipe.execute())
        }

    def list_ids(self, api_name: str, limit: int = 100) -> list[str]:
        """Job ids of an API, newest first."""
        return [raw.decode() for raw in self._redis.zrevrange(self._api_jobs_key(api_name), 0, limit - 1)]

    def active_ids(self) -> list[str]:
        return sorted(raw.decode() for raw in self._redis.smembers(self._ACTIVE_KEY))

    def transition(
        self,
        job_id: str,
        new_status: JobStatus,
        allowed_from: Iterable[JobStatus] = ACTIVE_STATUSES,
        message: str = "",
        now: float | None = None,
    ) -> bool:
        """Move a job to `new_status` only if its current status is one of `allowed_from`.

        Returns whether the job moved. A terminal status also stamps the end time, leaves the
        active set and starts the record's expiry clock.
        """
        end_time = ""
        if new_status.is_terminal:
            end_time = repr(time.time() if now is None else now)
        named = self._keys_of(job_id)
        moved = bool(
            self._transition(
                keys=[named["job"], keys.figure(ENDED_JOBS)],
                args=[new_status.value, end_time, message, new_token(), *[s.value for s in allowed_from]],
            )
        )
        if moved and new_status.is_terminal:
            pipe = self._redis.pipeline()
            pipe.srem(self._ACTIVE_KEY, job_id)
            for key in named.values():
                pipe.expire(key, self._job_ttl_s)
            pipe.execute()
        return moved

    def touch_enqueue(self, job_id: str, now: float) -> None:
        """The enqueuer is alive: beat fails a job whose enqueuer went silent (see beat/steps.py)."""
        self._redis.hset(self._job_key(job_id), "enqueue_seen", repr(now))

    def enqueue_seen(self, job_id: str) -> float | None:
        raw = self._redis.hget(self._job_key(job_id), "enqueue_seen")
        return float(raw) if raw is not None else None

    def update_record(self, job: Job) -> None:
        """Rewrite the fixed part of a job once enqueueing knows it all (e.g. its batch count)."""
        self._redis.hset(self._job_key(job.job_id), "record", json.dumps(job.to_dict()))

    def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        self._redis.hset(self._job_key(job_id), "nodes", json.dumps(nodes))

    def claim_completion(self, job_id: str, token: str, task_id: str = "") -> Claim:
        """Ask to run the job's `on_job_complete`, which runs at most once per job.

        `token` is "<task id>/<something unique to this run of the task>"; asking again with the
        same token (a repeat after a lost reply) is answered `CLAIMED` again until the hook is done.
        """
        raw = self._claim_completion(keys=[self._job_key(job_id)], args=[token, task_id])
        return Claim(raw.decode() if isinstance(raw, bytes) else raw)

    def mark_hook_done(self, job_id: str, message: str = "") -> None:
        """`on_job_complete` has run (`message`: how it failed, '' if it did not): it never runs again."""
        self._redis.hset(self._job_key(job_id), "hook_done", message)

    def mark_completion_resent(self, job_id: str, now: float) -> None:
        self._redis.hset(self._job_key(job_id), "completion_resent_at", repr(now))

    # -- batches ----------------------------------------------------------------------------
    def begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> BatchStart:
        """Check and count a delivery of a batch; one that will run is entered in its node's in-flight hash."""
        named = self._keys_of(job_id)
        args = [index, delivery.task_id if delivery else "", inflight_entry(job_id, index), new_token(),
                *[s.value for s in ACTIVE_STATUSES]]
        node_key = keys.inflight(delivery.node if delivery else "")
        raw_status, done, deliveries = _until_answered(
            f"starting batch {index} of job {job_id}",
            lambda: self._begin_batch(keys=[named["job"], named["done"], named["starts"], node_key], args=args),
        )
        status = JobStatus(raw_status.decode()) if raw_status else None
        return BatchStart(status=status, already_recorded=bool(done), deliveries=int(deliveries))

    def seal(self, job_id: str, total_batch_count: int, now: float | None = None) -> bool:
        """Fix the job's batch count once all are enqueued; True if they are all recorded already.

        Exactly one caller of `seal` and the `record_*` methods is ever told that a job is complete.
        """
        named = self._keys_of(job_id)
        now = time.time() if now is None else now
        return bool(self._seal(keys=[named["job"], named["done"]], args=[total_batch_count, new_token(), repr(now)]))

    def _record(
        self, job_id: str, index: int, outcome: str, seconds: float, failure: str, delivery: Delivery | None
    ) -> Recorded:
        named = self._keys_of(job_id)
        args = [index, outcome, seconds, failure, delivery.task_id if delivery else "", new_token(), repr(time.time())]
        node_key = keys.inflight(delivery.node if delivery else "")
        return Recorded(_until_answered(
            f"recording batch {index} of job {job_id}",
            lambda: self._record_batch(
                keys=[named["job"], named["done"], named["failed"], node_key, named["payloads"]], args=args,
            ),
        ))

    def recorded_indexes(self, job_id: str) -> set[int]:
        """The indexes of every batch of the job whose outcome is recorded."""
        return {int(raw) for raw in self._redis.smembers(self._keys_of(job_id)["done"])}

    def keep_payloads(self, job_id: str, payloads: dict[int, tuple[Any, dict[str, Any] | None]]) -> None:
        """Keep what each of these batches carries (items, or where they live) until its outcome is recorded.

        The broker can lose a batch's message outright (kombu's Redis transport pops it with BRPOP and
        only then records it as unacknowledged: a node killed in between takes it along); beat then
        publishes the batch again from here (`beat/lost_batches.py`). Recording a batch drops its copy.
        """
        if not payloads:
            return
        key = self._keys_of(job_id)["payloads"]
        self._redis.hset(key, mapping={str(index): json.dumps(list(batch)) for index, batch in payloads.items()})
        ttl = self._redis.ttl(self._job_key(job_id))
        if ttl > 0:  # the job already ended: expire with it
            self._redis.expire(key, ttl)

    def kept_payloads(self, job_id: str, indexes: Iterable[int]) -> dict[int, tuple[Any, dict[str, Any] | None]]:
        """(payload, payload reference) of those of `indexes` whose copy is kept (see `keep_payloads`)."""
        indexes = list(indexes)
        if not indexes:
            return {}
        raws = self._redis.hmget(self._keys_of(job_id)["payloads"], [str(i) for i in indexes])
        kept = {}
        for index, raw in zip(indexes, raws):
            if raw is not None:
                payload, ref = json.loads(raw)
                kept[index] = (payload, ref)
        return kept

    def recorded(self, job_id: str, indexes: Iterable[int]) -> dict[int, bool]:
        """Whether each of these batches of the job has its outcome recorded."""
        indexes = list(indexes)
        if not indexes:
            return {}
        flags = self._redis.smismember(self._keys_of(job_id)["done"], indexes)
        return {index: bool(flag) for index, flag in zip(indexes, flags)}

    def record_success(self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None) -> Recorded:
        """Count a finished batch once (and take it off its node's in-flight hash)."""
        return self._record(job_id, index, "ok", seconds, "", delivery)

    def record_failure(
        self, job_id: str, index: int, seconds: float, error: str, tries: int, payload: Any,
        payload_ref: dict[str, Any] | None = None, delivery: Delivery | None = None,
    ) -> Recorded:
        """Count a failed batch once and keep it (error, tries, payload or where it lives) for inspection."""
        record = failed_batch_record(index, error, tries, payload, payload_ref)
        return self._record(job_id, index, "failed", seconds, record, delivery)

    def record_part(self, job_id: str, index: int, rows: int) -> None:
        """Remember the output part a batch wrote, for the job's manifest."""
        named = self._keys_of(job_id)
        self._redis.hset(named["parts"], str(index), rows)
        ttl = self._redis.ttl(named["job"])
        if ttl > 0:  # the job ended while this batch ran: expire with it
            self._redis.expire(named["parts"], ttl)

    def parts(self, job_id: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in self._redis.hgetall(self._keys_of(job_id)["parts"]).items()}

    def failed_batches(self, job_id: str) -> list[dict[str, Any]]:
        raw = self._redis.hgetall(self._keys_of(job_id)["failed"])
        return sorted((json.loads(v) for v in raw.values()), key=lambda f: f["index"])
