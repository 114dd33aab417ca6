"""Where every process's figures are summed, and read back: one hash of numbers per figure.

`foundation.figures.Recorder` counts in memory and adds its deltas to a `FigureStore` about once a
second; `foundation.figures.read_figures` reads the sums back and makes totals of them.
`RedisFigureStore` is the one every Sluice process shares (one Redis hash per figure, the key
`keys.figure(name)`), `foundation.memory.MemoryFigureStore` a dict for fast tests; both pass
`tests/contracts/figure_store.py`.

The store knows keys, fields and numbers only; what a field means (label values, a histogram's
bucket) is `foundation/figures.py`'s, so the two stores cannot read the same sums differently.
The job store adds to the same hashes from inside its status-change script (`jobs/store/lua/transition.lua`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import redis

from .redis_clients import text


@dataclass(frozen=True)
class Increment:
    """Add `amount` to the number in `field` of the hash `key` (a missing one counts as 0).

    An `int` adds exactly (HINCRBY), a `float` as a float (HINCRBYFLOAT): counts are ints, sums floats.
    """

    key: str
    field: str
    amount: int | float


class FigureStore(Protocol):
    """Sums of numbers, one hash per figure, added to by every process."""

    def add(self, increments: Sequence[Increment]) -> None:
        """Add every increment, in one round trip. Raises `redis.RedisError` when the store cannot be
        reached (a `redis.ConnectionError` when not at all): then some may have been added, or none."""
        ...

    def read(self, keys: Sequence[str]) -> list[dict[str, float]]:
        """Each key's fields and their sums, in the order of `keys` ({} for a key never added to)."""
        ...


class RedisFigureStore(FigureStore):
    """`FigureStore` in Redis hashes; the client is passed in (a flusher's: no retries, short timeouts)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def add(self, increments: Sequence[Increment]) -> None:
        if not increments:
            return
        pipe = self._redis.pipeline(transaction=False)
        for increment in increments:
            if isinstance(increment.amount, int):
                pipe.hincrby(increment.key, increment.field, increment.amount)
            else:
                pipe.hincrbyfloat(increment.key, increment.field, increment.amount)
        pipe.execute()

    def read(self, keys: Sequence[str]) -> list[dict[str, float]]:
        if not keys:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return [
            {(text(field)): float(value) for field, value in raw.items()}
            for raw in pipe.execute()
        ]
