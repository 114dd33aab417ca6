"""`Idempotency-Key`: a submission sent again with the same key gets the job the first one made.

A client that timed out cannot know whether its submission was taken; sending it again must not
make a second job. The key (the client's own text) is claimed for a day, atomically, with the id
the submission is about to create; a second submission with it finds the claim and answers that
job. A claim whose job never came to exist (its submitter failed or died between claim and record)
is taken over once it is `STALE_CLAIM_S` old, so a key is never stuck.
"""

from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import keys
from .errors import BadRequest

if TYPE_CHECKING:
    import redis

HEADER = "Idempotency-Key"
KEEP_S = 24 * 3600
STALE_CLAIM_S = 60.0
_VALID = re.compile(r"^[A-Za-z0-9._:\-]{1,255}$")

# Claim `key` for ARGV[1] unless it is held; a held claim whose id is ARGV[3] (stale, seen by the
# caller) is replaced. Answers the id that holds the key afterwards.
_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held == false or held == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return ARGV[1]
end
return held
"""


def checked_key(value: str | None) -> str | None:
    """The header's key, or None without one; a key that is not 1-255 of `A-Za-z0-9._:-` is refused."""
    if value is None:
        return None
    if not _VALID.match(value):
        raise BadRequest(f"{HEADER} must be 1 to 255 letters, digits or . _ : - (a UUID is one)")
    return value


class IdempotencyKeys(ABC):
    """The claims of idempotency keys, per scope (an API's submissions)."""

    @abstractmethod
    def claim(self, scope: str, key: str, candidate: str, stale: str = "") -> str:
        """The id the key stands for: `candidate` when this call claimed it (or took over the stale
        claim `stale`), else the id of the submission that holds it."""

    @abstractmethod
    def release(self, scope: str, key: str, candidate: str) -> None:
        """Give the key back after the submission it was claimed for failed (only if still its own)."""


def derived_id(key: str) -> str:
    """An id that only this key gives (32 hex digits), for a store that already refuses a second
    record of one id (an AsyncAPI request's): the key then needs no claim of its own."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"idempotency-key/{key}").hex


def claimed_at(job_id: str) -> float | None:
    """When a claim was made, from its job id (`jobs.batch.job.new_job_id`: milliseconds in hex first)."""
    try:
        return int(job_id[:12], 16) / 1000
    except ValueError:
        return None


@dataclass
class RedisIdempotencyKeys(IdempotencyKeys):
    """Claims as Redis strings that expire after `KEEP_S`, taken and replaced by one script each."""

    client: redis.Redis

    def claim(self, scope: str, key: str, candidate: str, stale: str = "") -> str:
        held = self.client.eval(_CLAIM, 1, keys.idempotency(scope, key), candidate, KEEP_S, stale or "\0")
        return held.decode() if isinstance(held, bytes) else str(held)

    def release(self, scope: str, key: str, candidate: str) -> None:
        self.client.eval("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
                         "return 0", 1, keys.idempotency(scope, key), candidate)
