"""The least-recently-used map behind the model caches."""

from __future__ import annotations

import pytest

from predictors_runtime.models.cache import LRU


def test_the_least_recently_used_entry_is_evicted_first() -> None:
    cache: LRU[str, int] = LRU(2)
    assert cache.put("a", 1) == []
    assert cache.put("b", 2) == []
    assert cache.get("a") == 1  # "b" is now the least recently used
    assert cache.put("c", 3) == [("b", 2)]
    assert cache.keys() == ["a", "c"]


def test_peek_and_contains_do_not_mark_an_entry_used() -> None:
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.peek("a") == 1 and "a" in cache
    assert cache.put("c", 3) == [("a", 1)]


def test_replacing_a_value_evicts_nothing_and_marks_it_used() -> None:
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.put("a", 10) == []
    assert cache.keys() == ["b", "a"]
    assert cache.get("a") == 10


def test_pop_removes_and_missing_keys_give_none() -> None:
    cache: LRU[str, int] = LRU(None)
    cache.put("a", 1)
    assert cache.pop("a") == 1
    assert cache.pop("a") is None
    assert cache.get("a") is None
    assert len(cache) == 0


def test_no_capacity_means_no_limit() -> None:
    cache: LRU[int, int] = LRU(None)
    for i in range(1000):
        assert cache.put(i, i) == []
    assert len(cache) == 1000


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        LRU(0)
