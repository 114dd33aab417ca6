"""What an AsyncAPI is doing now: requests queued and in progress, ended per minute, serving nodes.

The request store keeps these counts in the same scripts that change the requests' records
(`jobs/asyncapi/store.py`), so a count moves exactly when a request does, whichever node or API
process moved it; nothing is counted twice for a request delivered twice. Requests ended are
counted per slot of `SLOT_S` seconds; the per-minute figures are the `WINDOW_SLOTS` whole slots
before the current one (so they trail by up to `SLOT_S`). `sluice get` and `/metrics` read them.

A request whose record expires before a node ever takes it (it waited out the whole retention)
stays counted as queued unless beat's sweep finds its record first; counts read never go below 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

SLOT_S = 10
WINDOW_SLOTS = 6  # 6 slots of 10 s: one minute
SLOT_TTL_S = SLOT_S * (WINDOW_SLOTS + 6)  # a slot's hash outlives the window that reads it


def slot_of(now: float) -> int:
    """The slot `now` falls in."""
    return math.floor(now / SLOT_S)


def window_slots(now: float) -> list[int]:
    """The whole slots of the last minute before `now`'s own, oldest first."""
    current = slot_of(now)
    return list(range(current - WINDOW_SLOTS, current))


@dataclass(frozen=True)
class AsyncCounts:
    """One AsyncAPI's requests: waiting, running, and ended in the last minute (by outcome)."""

    in_queue: int = 0
    in_progress: int = 0
    completed_per_minute: int = 0
    failed_per_minute: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"in_queue": self.in_queue, "in_progress": self.in_progress,
                "completed_per_minute": self.completed_per_minute, "failed_per_minute": self.failed_per_minute}


def _int(raw: Mapping[bytes | str, bytes | str], name: str) -> int:
    value = raw.get(name.encode(), raw.get(name))
    if value is None:
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def counts_from(now_counts: Mapping[bytes | str, bytes | str],
                ended_slots: list[Mapping[bytes | str, bytes | str]]) -> AsyncCounts:
    """The counts from the stored hashes: the API's gauges and its slots of the last minute."""
    return AsyncCounts(
        in_queue=_int(now_counts, "in_queue"), in_progress=_int(now_counts, "in_progress"),
        completed_per_minute=sum(_int(slot, "completed") for slot in ended_slots),
        failed_per_minute=sum(_int(slot, "failed") for slot in ended_slots),
    )
