"""The batch ledger in Redis: each delivery counted, each outcome recorded once, and the fan-in.

Beginning and recording a batch are scripts (`lua/begin_batch.lua`, `lua/record_batch.lua`,
`lua/seal.lua`) that also enter and remove the batch in its node's in-flight hash, so that a batch
leaves it in the same step as its outcome is counted, and write and remove its message in kombu's
unacknowledged hash when the transport leaves that to them (`BrokerReceipt`); everything else about nodes is
`jobs/nodes/registry.py`'s. A node holding a delivery waits for Redis however long it is away (`jobs/store/answers.py`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

import redis
from redis.typing import EncodableT

from foundation import keys
from jobs.batch.job import ACTIVE_STATUSES
from jobs.store import scripts, values
from jobs.store.answers import Answer, SentScript
from jobs.store.values import DEFAULT_JOB_TTL_S, BatchStart, Payload, Recorded, batch_start, failed_batch_record
from jobs.transport.delivery import BROKER_UNACKED, BROKER_UNACKED_INDEX, Delivery, inflight_entry

log = logging.getLogger(__name__)

class RedisBatchLedger:
    """`BatchLedger` in Redis. Keys of a batch recorded after its job ended expire with the job."""

    def __init__(self, client: redis.Redis, job_ttl_s: float = DEFAULT_JOB_TTL_S) -> None:
        self._redis = client
        self._job_ttl_s = int(job_ttl_s)
        self._begin_batch = scripts.register(client, "begin_batch")
        self._record_batch = scripts.register(client, "record_batch")
        self._seal = scripts.register(client, "seal")

    def begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> BatchStart:
        return self.send_begin_batch(job_id, index, delivery).answer()

    def send_begin_batch(self, job_id: str, index: int, delivery: Delivery | None = None) -> Answer[BatchStart]:
        named = keys.job_keys(job_id)
        receipt = delivery.receipt if delivery is not None else None
        unacked = receipt if receipt is not None and receipt.unacked and not receipt.written else None
        args: list[EncodableT] = [
            index, delivery.task_id if delivery else "", inflight_entry(job_id, index), values.new_token(),
            *((unacked.tag, unacked.unacked, repr(unacked.taken_at)) if unacked else ("", "", "")),
            *[s.value for s in ACTIVE_STATUSES],
        ]
        script_keys = [named["job"], named["done"], named["starts"], keys.inflight(delivery.node if delivery else ""),
                       BROKER_UNACKED, BROKER_UNACKED_INDEX, keys.job_timed_out(job_id)]
        sent = SentScript(self._redis, self._begin_batch, script_keys, args,
                          f"starting batch {index} of job {job_id}", convert=batch_start)
        if unacked is not None:
            unacked.written = True  # by the script on its way, whenever its answer is read
        return sent

    def seal(self, job_id: str, total_batch_count: int, now: float | None = None) -> bool:
        named = keys.job_keys(job_id)
        now = time.time() if now is None else now
        return bool(self._seal(keys=[named["job"], named["done"]],
                               args=[total_batch_count, values.new_token(), repr(now)]))

    def _send_record(
        self, job_id: str, index: int, outcome: str, seconds: float, failure: str, delivery: Delivery | None
    ) -> Answer[Recorded]:
        named = keys.job_keys(job_id)
        receipt = delivery.receipt if delivery is not None else None
        args: list[EncodableT] = [index, outcome, seconds, failure, delivery.task_id if delivery else "",
                                  values.new_token(), repr(time.time()), receipt.tag if receipt else ""]
        script_keys = [named["job"], named["done"], named["failed"], keys.inflight(delivery.node if delivery else ""),
                       named["payloads"], BROKER_UNACKED, BROKER_UNACKED_INDEX]
        sent = SentScript(self._redis, self._record_batch, script_keys, args,
                          f"recording batch {index} of job {job_id}", convert=Recorded)
        if receipt is not None:
            receipt.acknowledged = True  # by the script on its way, whenever its answer is read
        return sent

    def record_success(self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None) -> Recorded:
        return self._send_record(job_id, index, "ok", seconds, "", delivery).answer()

    def send_record_success(
        self, job_id: str, index: int, seconds: float, delivery: Delivery | None = None
    ) -> Answer[Recorded]:
        return self._send_record(job_id, index, "ok", seconds, "", delivery)

    def record_failure(
        self, job_id: str, index: int, seconds: float, error: str, tries: int, payload: Any,
        payload_ref: dict[str, Any] | None = None, delivery: Delivery | None = None,
    ) -> Recorded:
        record = failed_batch_record(index, error, tries, payload, payload_ref)
        return self._send_record(job_id, index, "failed", seconds, record, delivery).answer()

    def recorded_indexes(self, job_id: str) -> set[int]:
        return {int(raw) for raw in self._redis.smembers(keys.job_done(job_id))}

    def recorded(self, job_id: str, indexes: Iterable[int]) -> dict[int, bool]:
        indexes = list(indexes)
        if not indexes:
            return {}
        flags = self._redis.smismember(keys.job_done(job_id), indexes)
        return {index: bool(flag) for index, flag in zip(indexes, flags, strict=False)}

    def _expire_with_job(self, job_id: str, key: str) -> None:
        """A key written after the job ended (its hash has a TTL then) expires with it."""
        ttl = self._redis.ttl(keys.job(job_id))
        if ttl > 0:
            self._redis.expire(key, ttl)

    def keep_payloads(self, job_id: str, payloads: dict[int, Payload]) -> None:
        """See `BatchLedger.keep_payloads`. The broker can lose a batch's message outright (kombu's
        Redis transport pops it with BRPOP and only then records it as unacknowledged, at the batch's
        begin: a node killed in between takes it along). Recording a batch drops its copy."""
        if not payloads:
            return
        key = keys.job_payloads(job_id)
        self._redis.hset(key, mapping={str(index): json.dumps(list(batch)) for index, batch in payloads.items()})
        self._expire_with_job(job_id, key)

    def kept_payloads(self, job_id: str, indexes: Iterable[int]) -> dict[int, Payload]:
        indexes = list(indexes)
        if not indexes:
            return {}
        raws = self._redis.hmget(keys.job_payloads(job_id), [str(i) for i in indexes])
        kept: dict[int, Payload] = {}
        for index, raw in zip(indexes, raws, strict=False):
            if raw is not None:
                payload, ref = json.loads(raw)
                kept[index] = (payload, ref)
        return kept

    def record_part(self, job_id: str, index: int, rows: int) -> None:
        key = keys.job_parts(job_id)
        self._redis.hset(key, str(index), rows)
        self._expire_with_job(job_id, key)

    def parts(self, job_id: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in self._redis.hgetall(keys.job_parts(job_id)).items()}

    def failed_batches(self, job_id: str) -> list[dict[str, Any]]:
        raw = self._redis.hgetall(keys.job_failed(job_id))
        return sorted((json.loads(v) for v in raw.values()), key=lambda f: f["index"])

    def timed_out_tries(self, job_id: str, index: int) -> int:
        raw = self._redis.hget(keys.job_timed_out(job_id), str(index))
        return int(raw) if raw is not None else 0

    def mark_timed_out(self, job_id: str, index: int, tries_used: int) -> None:
        """Kept across the node restarts a timed-out try causes, for the job's TTL."""
        pipe = self._redis.pipeline()
        pipe.hset(keys.job_timed_out(job_id), str(index), tries_used)
        pipe.expire(keys.job_timed_out(job_id), self._job_ttl_s)
        pipe.execute()
