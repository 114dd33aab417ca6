"""Each API process keeps the routes it read (`api/context.py` `route_in`), and a deploy or delete in
any process is seen by every other at its next request: two processes' kept routes over one registry."""

from __future__ import annotations

from typing import Any

import pytest

from api.context import REGISTRY, route_in
from foundation.errors import ApiNotFound
from foundation.memory import MemoryApiRegistry
from predictors_runtime.config import ApiConfig


def realtime(name: str, threshold: float) -> ApiConfig:
    return ApiConfig.from_dict({"name": name, "kind": "RealtimeAPI",
                                "predictor": {"path": "predictor.py", "config": {"threshold": threshold}}})


@pytest.fixture
def two_processes() -> tuple[MemoryApiRegistry, dict[str, Any], dict[str, Any]]:
    """One registry, and the app extensions of two API processes in front of it."""
    shared = MemoryApiRegistry()
    return shared, {REGISTRY: shared}, {REGISTRY: shared}


def test_an_api_deleted_by_one_process_is_not_found_by_the_other_at_once(two_processes):
    shared, first, second = two_processes
    shared.put(realtime("sum", 0.5), "b1")
    assert route_in(second, "sum").bundle == "b1"  # kept by the second process

    shared.delete("sum")  # what the first process's DELETE /apis/sum does

    with pytest.raises(ApiNotFound, match="api sum is not deployed"):
        route_in(second, "sum")
    with pytest.raises(ApiNotFound):
        route_in(first, "sum")


def test_a_redeploy_in_one_process_is_routed_by_the_other_at_once(two_processes):
    shared, _, second = two_processes
    shared.put(realtime("sum", 0.5), "b1")
    route_in(second, "sum")

    shared.put(realtime("sum", 0.9), "b2")

    assert route_in(second, "sum").bundle == "b2"


def test_a_kept_route_is_not_read_again_while_nothing_is_deployed(two_processes, monkeypatch):
    shared, _, second = two_processes
    shared.put(realtime("sum", 0.5), "b1")
    route_in(second, "sum")
    reads: list[str] = []
    get = shared.get
    monkeypatch.setattr(shared, "get", lambda name: reads.append(name) or get(name))

    for _ in range(5):
        assert route_in(second, "sum").bundle == "b1"

    assert reads == []
    shared.put(realtime("other", 0.1), "b9")  # any deploy moves the generation
    route_in(second, "sum")
    assert reads == ["sum"]
