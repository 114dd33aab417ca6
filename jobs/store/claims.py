"""Completion claims in Redis: who runs a job's `on_job_complete`, at most once (`lua/claim_completion.lua`).

The completion task may arrive several times (a lost reply, a dead node, beat's re-send:
`jobs/batch/completion.py`); each copy asks here, and the claim decides which one runs the hook.
"""

from __future__ import annotations

import redis

from foundation import keys
from foundation.redis_clients import text
from jobs.store import scripts
from jobs.store.schema import JobField
from jobs.store.values import DEFAULT_JOB_TTL_S, Claim


class RedisCompletionClaims:
    """`CompletionClaims` in Redis, on the job's own hash."""

    def __init__(self, client: redis.Redis, job_ttl_s: float = DEFAULT_JOB_TTL_S) -> None:
        self._redis = client
        self._job_ttl_s = int(job_ttl_s)
        self._claim_completion = scripts.register(client, "claim_completion")

    def claim_completion(self, job_id: str, token: str, task_id: str = "") -> Claim:
        raw = self._claim_completion(keys=[keys.job(job_id)], args=[token, task_id])
        return Claim(text(raw))

    def mark_hook_done(self, job_id: str, message: str = "") -> None:
        self._redis.hset(keys.job(job_id), JobField.HOOK_DONE, message)

    def mark_completion_resent(self, job_id: str, now: float) -> None:
        self._redis.hset(keys.job(job_id), JobField.COMPLETION_RESENT_AT, repr(now))
