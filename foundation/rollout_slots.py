"""Rollout slots: how many of an API's replicas a redeploy replaces at once, across every host.

Each replica's launcher replaces its own replica when the API is redeployed. Left to themselves,
all of them would start their new replica at once (a surge of 100%). Before it starts, a launcher
takes a slot for the new deployment: a `surge` slot (its new replica starts beside the old one,
which drains once the new one is ready) while fewer than `max_surge` are held, else an
`unavailable` slot (its old replica drains first, then the new one starts) while fewer than
`max_unavailable` are; with neither free it waits for its next turn. It gives the slot back once its
new replica is ready. A hold lapses `HOLD_S` after it was last renewed, so a launcher that died
holding one does not stall the redeploy.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import keys

if TYPE_CHECKING:
    import redis

SURGE = "surge"
UNAVAILABLE = "unavailable"
HOLD_S = 30.0

# Drop lapsed holds; keep (renew) the caller's own; else take one while fewer than ARGV[4] are held.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
  return 1
end
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
  redis.call('EXPIRE', KEYS[1], 3600)
  return 1
end
return 0
"""


class RolloutSlots(ABC):
    """The slots of each (api, deployment), by kind."""

    @abstractmethod
    def take(self, api_name: str, deployment: str, kind: str, holder: str, limit: int, now: float) -> bool:
        """Hold (or renew the hold of) a slot of `kind`; False when `limit` others hold one."""

    @abstractmethod
    def give_back(self, api_name: str, deployment: str, holder: str) -> None:
        """Let go of what `holder` holds for this deployment, of either kind."""


@dataclass
class RedisRolloutSlots(RolloutSlots):
    """Slots as sorted sets in Redis, taken by one script each."""

    client: redis.Redis

    def take(self, api_name: str, deployment: str, kind: str, holder: str, limit: int, now: float) -> bool:
        if limit <= 0:
            return False
        taken = self.client.eval(_TAKE, 1, keys.rollout_slots(api_name, deployment, kind), now, now + HOLD_S,
                                 holder, limit)
        return bool(taken)

    def give_back(self, api_name: str, deployment: str, holder: str) -> None:
        with self.client.pipeline(transaction=False) as pipe:
            for kind in (SURGE, UNAVAILABLE):
                pipe.zrem(keys.rollout_slots(api_name, deployment, kind), holder)
            pipe.execute()


@dataclass
class MemoryRolloutSlots(RolloutSlots):
    """The same in a dict (one process's launchers; fast tests)."""

    holds: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, api_name: str, deployment: str, kind: str, holder: str, limit: int, now: float) -> bool:
        if limit <= 0:
            return False
        with self.lock:
            held = self.holds.setdefault((api_name, deployment, kind), {})
            for other, until in list(held.items()):
                if until <= now:
                    del held[other]
            if holder in held or len(held) < limit:
                held[holder] = now + HOLD_S
                return True
            return False

    def give_back(self, api_name: str, deployment: str, holder: str) -> None:
        with self.lock:
            for kind in (SURGE, UNAVAILABLE):
                self.holds.get((api_name, deployment, kind), {}).pop(holder, None)
