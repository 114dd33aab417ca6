"""A Redis hash of named records, each stored as JSON: the one shape behind the registries that
keep a record per API (decided replica counts, replica placements).

Reading it back skips nothing silently: a record that does not decode raises, as each registry's
contract says, so a damaged one is noticed where it is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import redis

from .redis_clients import text

T = TypeVar("T")


class JsonHash(Generic[T]):
    """Records of type `T` by name in the hash `key`, through `to_dict` and `from_dict`."""

    def __init__(self, client: redis.Redis, key: str, to_dict: Callable[[T], dict[str, Any]],
                 from_dict: Callable[[dict[str, Any]], T]) -> None:
        self._redis = client
        self._key = key
        self._to_dict = to_dict
        self._from_dict = from_dict

    def get(self, name: str) -> T | None:
        raw = self._redis.hget(self._key, name)
        return None if raw is None else self._from_dict(json.loads(raw))

    def all(self) -> dict[str, T]:
        return {text(name): self._from_dict(json.loads(raw)) for name, raw in self._redis.hgetall(self._key).items()}

    def set(self, name: str, record: T) -> None:
        self._redis.hset(self._key, name, json.dumps(self._to_dict(record)))

    def forget(self, name: str) -> None:
        self._redis.hdel(self._key, name)
