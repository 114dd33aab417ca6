"""An AsyncAPI's node count follows its queue (queued plus running requests), one decision a tick,
by Cortex's algorithm: up within the factor limits, down after the stabilisation period, to zero
with `min_replicas: 0`, and back to one node at once when a request comes."""

from __future__ import annotations

from typing import Any

from foundation.api_registry import DeployedApi
from jobs.scaling.asyncapi import AsyncScaler
from jobs.scaling.config import autoscaling_of
from predictors_runtime.config import ApiConfig

DEPLOYED_AT = 1_000.0
NOW = DEPLOYED_AT + 3_600  # long after the deploy: no start-up hold


def api(**autoscaling: Any) -> DeployedApi:
    config = ApiConfig.model_validate({"name": "summarise", "kind": "AsyncAPI", "predictor": {"path": "p.py"},
                                       "autoscaling": {"window": "10s", **autoscaling}})
    return DeployedApi.of(config, "bundle-1", now=DEPLOYED_AT)


def run(scaler: AsyncScaler, deployed: DeployedApi, in_flight: list[int], start: float = NOW, step: float = 5.0,
        placed: int = 1) -> list[int]:
    """The count wanted at each beat step, the in-flight figure of each step given."""
    return [scaler.wanted(deployed, autoscaling_of(deployed), n, placed, start + i * step)
            for i, n in enumerate(in_flight)]


def test_a_growing_queue_adds_nodes_within_the_upscale_factor_one_decision_a_tick() -> None:
    deployed = api(min_replicas=1, max_replicas=4, upscale_stabilization_period="0s")
    counts = run(AsyncScaler(), deployed, [4] * 7)
    # ticks at steps 0, 2, 4, 6 (10 s apart): 1 -> 2 (one up always allowed) -> 3 (ceil 2 x 1.5) -> 4 (max)
    assert counts == [2, 2, 3, 3, 4, 4, 4]


def test_an_idle_api_with_min_replicas_0_goes_to_zero_after_the_downscale_period_and_wakes_at_once() -> None:
    deployed = api(min_replicas=0, downscale_stabilization_period="20s", max_downscale_factor=0.5)
    scaler = AsyncScaler()
    busy = run(scaler, deployed, [1, 1, 1, 1])  # 15 s of one request in flight: one node
    assert busy == [1, 1, 1, 1]
    idle = run(scaler, deployed, [0] * 8, start=NOW + 20)
    # Steps 5 s apart from +20 s; ticks at +20 (the window still holds a busy sample: 1), +30 and +40
    # (recommending 0, held at 1 by the busy tick of +20 within the 20 s period), +50: none.
    assert idle == [1, 1, 1, 1, 1, 1, 0, 0]
    assert run(scaler, deployed, [1], start=NOW + 61) == [1]  # a request: one node, not at the next tick


def test_the_count_is_kept_between_ticks_and_shown_with_its_in_flight_figure() -> None:
    deployed = api(min_replicas=1)
    scaler = AsyncScaler()
    assert scaler.scale("summarise") is None
    run(scaler, deployed, [2, 2])
    scale = scaler.scale("summarise")
    assert scale is not None and scale.in_flight == 2.0 and scale.desired >= 1
    scaler.forget("summarise")
    assert scaler.scale("summarise") is None


def test_a_restarted_beat_takes_the_placed_nodes_as_the_current_count() -> None:
    deployed = api(min_replicas=1, max_replicas=10)
    assert run(AsyncScaler(), deployed, [3], placed=3) == [3]  # three in flight, three nodes: kept
