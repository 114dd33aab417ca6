"""A RealtimeAPI's replica count follows the requests in flight at its proxies: beat reads the
proxies' totals each step, decides once a tick with Cortex's algorithm, and writes each decision
to the scale book placement reads."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from foundation.memory import MemoryApiRegistry, MemoryProxyLoadBook, MemoryScaleBook
from foundation.proxy_load import LoadTally
from foundation.replica_scale import ReplicaScale
from jobs.scaling.realtime import RealtimeScaling
from predictors_runtime.config import ApiConfig

DEPLOYED_AT = 1_000.0
NOW = DEPLOYED_AT + 3_600  # long after the deploy: no start-up hold
STEP_S = 5.0               # beat's step


def deploy(registry: MemoryApiRegistry, name: str = "iris", **autoscaling: Any) -> None:
    config = ApiConfig.model_validate({"name": name, "kind": "RealtimeAPI", "predictor": {"path": "p.py"},
                                       "autoscaling": {"window": "10s", "upscale_stabilization_period": "0s",
                                                       **autoscaling}})
    registry.put(config, "bundle-1", now=DEPLOYED_AT)


class Stack:
    """One proxy sampling at 1 Hz between beat's steps, and beat's realtime step over the memory twins."""

    def __init__(self) -> None:
        self.registry, self.loads, self.book = MemoryApiRegistry(), MemoryProxyLoadBook(), MemoryScaleBook()
        self.scaling = RealtimeScaling()
        self.tally = LoadTally()

    def beat_steps(self, start: float, *in_flight: dict[str, int]) -> list[dict[str, int]]:
        """Each beat step after STEP_S seconds of the proxy sampling the given figures once a second."""
        counts = []
        for i, sample in enumerate(in_flight):
            now = start + i * STEP_S
            for _ in range(int(STEP_S)):
                self.tally.add(sample)
            self.loads.publish(self.tally.record("edge-1", now))
            counts.append(self.scaling.step(self.registry, self.loads, self.book, now))
        return counts


def test_a_steady_load_raises_the_decided_count_within_the_upscale_factor_one_decision_a_tick() -> None:
    stack = Stack()
    deploy(stack.registry, min_replicas=1, max_replicas=4)

    counts = stack.beat_steps(NOW, *[{"iris": 4}] * 8)

    # The first step sets the proxy's baseline; ticks 10 s apart from the second:
    # 1 -> 2 (one up always allowed) -> 3 (ceil 2 x 1.5) -> 4 (max_replicas).
    assert [c["iris"] for c in counts] == [1, 2, 2, 3, 3, 4, 4, 4]
    assert stack.book.get("iris") == ReplicaScale(desired=4, in_flight=4.0, decided_at=NOW + 7 * STEP_S)


def test_each_decision_is_one_log_line_with_its_inputs(caplog: pytest.LogCaptureFixture) -> None:
    stack = Stack()
    deploy(stack.registry, target_replica_concurrency=2)

    with caplog.at_level(logging.DEBUG, logger="jobs.scaling.scaler"):
        stack.beat_steps(NOW, {"iris": 6}, {"iris": 6})

    (line,) = [r for r in caplog.records if r.name == "jobs.scaling.scaler"]
    assert line.getMessage() == "realtime api iris: 1 -> 2 replica(s) (as recommended)"
    fields = {k: getattr(line, k) for k in ("api_name", "avg_in_flight", "raw_recommendation", "replicas")}
    assert fields == {"api_name": "iris", "avg_in_flight": 6.0, "raw_recommendation": 3.0, "replicas": 2}


def test_a_restarted_beat_starts_from_the_books_count_and_decides_nothing_before_it_measured() -> None:
    stack = Stack()
    deploy(stack.registry, min_replicas=1, max_replicas=10)
    stack.book.set("iris", ReplicaScale(desired=3, in_flight=3.0, decided_at=NOW - 60))

    (first,) = stack.beat_steps(NOW, {"iris": 3})
    assert first["iris"] == 3 and stack.book.get("iris") == ReplicaScale(3, 3.0, NOW - 60)  # baseline only

    (second,) = stack.beat_steps(NOW + STEP_S, {"iris": 3})
    # Three in flight on three replicas: kept, not back to init_replicas.
    assert second["iris"] == 3 and stack.book.get("iris") == ReplicaScale(3, 3.0, NOW + STEP_S)


def test_without_a_live_proxy_the_count_holds() -> None:
    stack = Stack()
    deploy(stack.registry, init_replicas=2, max_replicas=10)

    counts = [stack.scaling.step(stack.registry, stack.loads, stack.book, NOW + i * STEP_S) for i in range(4)]

    assert [c["iris"] for c in counts] == [2, 2, 2, 2]
    assert stack.book.get("iris") is None  # nothing decided: placement keeps init_replicas


def test_a_deleted_api_is_forgotten_from_the_book() -> None:
    stack = Stack()
    deploy(stack.registry, "iris")
    deploy(stack.registry, "mlp")
    stack.beat_steps(NOW, {"iris": 1, "mlp": 1}, {"iris": 1, "mlp": 1})
    assert set(stack.book.all()) == {"iris", "mlp"}

    stack.registry.delete("mlp")
    stack.beat_steps(NOW + 10, {"iris": 1})

    assert set(stack.book.all()) == {"iris"}
