"""Job records in Redis: a job's hash (`schema.JobField`), its API's index and the active jobs.

Status changes run in one script (`lua/transition.lua`) so that a terminal status is never
overwritten and a job that ends is counted once, whichever process ends it. Key names are
`foundation/keys.py`'s; the client is passed in, never found globally.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import redis
from redis.typing import EncodableT, FieldT

from foundation import keys
from foundation.figures import ENDED_JOBS
from foundation.redis_clients import text
from jobs.batch.job import ACTIVE_STATUSES, Job, JobStatus
from jobs.store import scripts, values
from jobs.store.schema import JobField, job_state, new_job_hash
from jobs.store.values import DEFAULT_JOB_TTL_S, JobState, not_found


def _status(raw: bytes | str | None) -> JobStatus | None:
    return JobStatus(text(raw)) if raw is not None else None


class RedisJobRecords:
    """`JobRecords` in Redis. An ended job's keys expire `job_ttl_s` after it ended."""

    def __init__(self, client: redis.Redis, job_ttl_s: float = DEFAULT_JOB_TTL_S) -> None:
        self._redis = client
        self._job_ttl_s = int(job_ttl_s)
        self._transition = scripts.register(client, "transition")
        self._note_predictor = scripts.register(client, "note_predictor")

    def create(self, job: Job, status: JobStatus = JobStatus.ENQUEUING) -> None:
        pipe = self._redis.pipeline()
        fields: dict[FieldT, EncodableT] = dict(new_job_hash(job, status).items())
        pipe.hset(keys.job(job.job_id), mapping=fields)
        pipe.zadd(keys.api_jobs(job.api_name), {job.job_id: job.start_time})
        pipe.sadd(keys.ACTIVE_JOBS, job.job_id)
        pipe.execute()

    def get(self, job_id: str, api_name: str | None = None) -> Job:
        raw = self._redis.hget(keys.job(job_id), JobField.RECORD)
        if raw is None:
            raise not_found(job_id, api_name)
        job = Job.from_dict(json.loads(raw))
        if api_name is not None and job.api_name != api_name:
            raise not_found(job_id, api_name)
        return job

    def state(self, job_id: str, api_name: str | None = None) -> JobState:
        raw = self._redis.hgetall(keys.job(job_id))
        if not raw:
            raise not_found(job_id, api_name)
        state = job_state({text(k): text(v) for k, v in raw.items()})
        if api_name is not None and state.job.api_name != api_name:
            raise not_found(job_id, api_name)
        return state

    def status(self, job_id: str) -> JobStatus | None:
        return _status(self._redis.hget(keys.job(job_id), JobField.STATUS))

    def statuses(self, job_ids: list[str]) -> dict[str, JobStatus | None]:
        pipe = self._redis.pipeline()
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), JobField.STATUS)
        return {job_id: _status(raw) for job_id, raw in zip(job_ids, pipe.execute(), strict=False)}

    def list_ids(self, api_name: str, limit: int = 100) -> list[str]:
        ids = self._redis.zrevrange(keys.api_jobs(api_name), 0, limit - 1)  # ids only: no scores asked
        return [text(raw) for raw in ids if isinstance(raw, (bytes, str))]

    def active_ids(self) -> list[str]:
        return sorted(text(raw) for raw in self._redis.smembers(keys.ACTIVE_JOBS))

    def transition(
        self, job_id: str, new_status: JobStatus, allowed_from: Iterable[JobStatus] = ACTIVE_STATUSES,
        message: str = "", now: float | None = None,
    ) -> bool:
        """See `JobRecords.transition`; a terminal status also starts the expiry clock of every key of the job."""
        end_time = repr(time.time() if now is None else now) if new_status.is_terminal else ""
        named = keys.job_keys(job_id)
        moved = bool(self._transition(
            keys=[named["job"], keys.figure(ENDED_JOBS)],
            args=[new_status.value, end_time, message, values.new_token(), *[s.value for s in allowed_from]],
        ))
        if moved and new_status.is_terminal:
            pipe = self._redis.pipeline()
            pipe.srem(keys.ACTIVE_JOBS, job_id)
            for key in named.values():
                pipe.expire(key, self._job_ttl_s)
            pipe.execute()
        return moved

    def touch_enqueue(self, job_id: str, now: float) -> None:
        self._redis.hset(keys.job(job_id), JobField.ENQUEUE_SEEN, repr(now))

    def enqueue_seen(self, job_id: str) -> float | None:
        raw = self._redis.hget(keys.job(job_id), JobField.ENQUEUE_SEEN)
        return float(raw) if raw is not None else None

    def update_record(self, job: Job) -> None:
        self._redis.hset(keys.job(job.job_id), JobField.RECORD, json.dumps(job.to_dict()))

    def set_nodes(self, job_id: str, nodes: list[str]) -> None:
        self._redis.hset(keys.job(job_id), JobField.NODES, json.dumps(nodes))

    def note_predictor(self, job_id: str, note: str) -> None:
        self._note_predictor(keys=[keys.job(job_id)], args=[note])
