"""A small least-recently-used map: the model manager keeps one for memory and one for disk.

Not thread-safe on its own; the manager holds its lock around every call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `capacity` entries (None: no limit); `put` returns what it pushed out."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None (got {capacity})")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The value of `key`, now the most recently used, or None when absent."""
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def peek(self, key: K) -> V | None:
        """The value of `key` without marking it used, or None when absent."""
        return self._entries.get(key)

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Store `value` as the most recently used; returns the `(key, value)` pairs evicted to make room.

        Replacing the value of a key already held evicts nothing (the old value is simply dropped).
        """
        self._entries[key] = value
        self._entries.move_to_end(key)
        evicted: list[tuple[K, V]] = []
        while self.capacity is not None and len(self._entries) > self.capacity:
            evicted.append(self._entries.popitem(last=False))
        return evicted

    def pop(self, key: K) -> V | None:
        """Remove `key`; its value, or None when absent."""
        return self._entries.pop(key, None)

    def keys(self) -> list[K]:
        """Keys from least to most recently used."""
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
