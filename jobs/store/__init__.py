"""The job store: job records, the batch ledger and completion claims, in Redis or in memory.

One module per concern and backend: the Protocols callers type against (`protocols.py`), the
job hash's fields (`schema.py`), the values answered (`values.py`), the Redis parts (`records.py`,
`ledger.py`, `claims.py`, their Lua scripts in `lua/`) and their in-memory twins (`memory.py`, for
tests: production code never imports it). `JobStore` is the Redis store a process uses: the three
parts over one client.
"""

from __future__ import annotations

import redis

from jobs.store.claims import RedisCompletionClaims
from jobs.store.ledger import RedisBatchLedger
from jobs.store.protocols import BatchLedger, CompletionClaims, JobRecords, JobStorage
from jobs.store.records import RedisJobRecords
from jobs.store.schema import JobField
from jobs.store.values import (
    DEFAULT_JOB_TTL_S,
    BatchStart,
    Claim,
    JobState,
    Payload,
    Recorded,
    failed_batch_record,
    new_token,
)

__all__ = [
    "BatchLedger", "BatchStart", "Claim", "CompletionClaims", "JobField", "JobRecords", "JobState", "JobStorage",
    "JobStore", "Payload", "Recorded", "RedisBatchLedger", "RedisCompletionClaims",
    "RedisJobRecords", "failed_batch_record", "new_token",
]


class JobStore(RedisJobRecords, RedisBatchLedger, RedisCompletionClaims):
    """The three parts in Redis over one client; the client is passed in, never found globally."""

    def __init__(self, client: redis.Redis, job_ttl_s: float = DEFAULT_JOB_TTL_S) -> None:
        RedisJobRecords.__init__(self, client, job_ttl_s)
        RedisBatchLedger.__init__(self, client, job_ttl_s)
        RedisCompletionClaims.__init__(self, client, job_ttl_s)
