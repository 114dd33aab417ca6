"""The replica count Cortex's algorithm gives, tick by tick, for hand-computed series of in-flight
requests, on a fixed clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from jobs.scaling.algorithm import Decision, InFlightSample, Recommendation, decide, history_to_keep
from predictors_runtime.autoscaling_config import AutoscalingConfig

NOW = 1_000_000.0
LONG_AGO = NOW - 86_400  # the scaler started long before: no start-up hold


def scaling(**fields: Any) -> AutoscalingConfig:
    """Cortex's defaults with a target of 1 in-flight request per replica, unless a test says."""
    return AutoscalingConfig(**{"target_replica_concurrency": 1, **fields})


def steady(in_flight: float, now: float = NOW, seconds: int = 60) -> list[InFlightSample]:
    """One sample a tick over the last `seconds`, all the same."""
    return [InFlightSample(now - age, in_flight) for age in range(seconds - 10, -1, -10)]


def tick(config: AutoscalingConfig, current: int, samples: list[InFlightSample],
         history: list[Recommendation] | None = None, started_at: float = LONG_AGO) -> Decision:
    return decide(config, now=NOW, current=current, samples=samples, history=history or [], started_at=started_at)


def test_before_any_sample_the_api_runs_init_replicas() -> None:
    decision = tick(scaling(min_replicas=1, init_replicas=3), current=0, samples=[])
    assert decision.replicas == 3
    assert decision.recommendation is None  # nothing to record


def test_without_a_sample_in_the_window_a_running_api_keeps_its_count() -> None:
    stale = [InFlightSample(NOW - 60, 50.0)]  # exactly one window old: outside it
    decision = tick(scaling(init_replicas=1), current=4, samples=stale, history=[Recommendation(NOW - 10, 4)])
    assert decision.replicas == 4
    assert decision.avg_in_flight is None and decision.recommendation is None


def test_the_samples_of_the_window_are_averaged_and_divided_by_the_target() -> None:
    samples = [InFlightSample(NOW - 70, 1000.0),  # before the window: left out
               InFlightSample(NOW - 20, 2.0), InFlightSample(NOW - 10, 4.0), InFlightSample(NOW, 12.0)]
    decision = tick(scaling(target_replica_concurrency=2), current=3, samples=samples)
    assert decision.avg_in_flight == 6.0
    assert decision.raw == 3.0
    assert (decision.recommendation, decision.replicas) == (3, 3)


def test_a_fractional_need_is_rounded_up_to_a_whole_replica() -> None:
    decision = tick(scaling(target_replica_concurrency=4), current=2, samples=steady(9))
    assert decision.raw == 2.25
    assert decision.replicas == 3


@pytest.mark.parametrize("in_flight, replicas", [
    (20.9, 20),  # raw 20.9 is within 5% above 20: no change
    (21.5, 22),  # beyond 21 (20 x 1.05): rounded up
    (19.1, 20),  # within 5% below 20
    (18.5, 19),  # below 19 (20 x 0.95): rounded up to 19
])
def test_a_recommendation_within_the_tolerance_band_keeps_the_current_count(in_flight: float, replicas: int) -> None:
    assert tick(scaling(), current=20, samples=steady(in_flight)).replicas == replicas


def test_the_tolerances_are_set_apart_for_each_direction() -> None:
    config = scaling(downscale_tolerance=0.1, upscale_tolerance=0)
    assert tick(config, current=20, samples=steady(18.5)).replicas == 20  # within 10% below
    assert tick(config, current=20, samples=steady(20.2)).replicas == 21  # no band above


def test_one_step_shrinks_by_at_most_the_downscale_factor_and_grows_by_at_most_the_upscale_factor() -> None:
    down = tick(scaling(), current=10, samples=steady(0))
    assert (down.downscale_factor_floor, down.replicas) == (8, 8)  # ceil(10 x 0.75)
    up = tick(scaling(), current=10, samples=steady(100))
    assert (up.upscale_factor_ceil, up.replicas) == (15, 15)  # ceil(10 x 1.5)
    assert tick(scaling(), current=3, samples=steady(100)).replicas == 5  # ceil(4.5): Cortex rounds up
    assert tick(scaling(max_downscale_factor=0.5), current=10, samples=steady(0)).replicas == 5


def test_one_replica_down_is_always_allowed_whatever_the_factor() -> None:
    decision = tick(scaling(max_downscale_factor=0.9), current=3, samples=steady(0))
    assert decision.downscale_factor_floor == 2  # ceil(3 x 0.9) = 3 would forbid any step
    assert decision.replicas == 2


def test_one_replica_up_is_always_allowed_even_from_zero() -> None:
    decision = tick(scaling(min_replicas=0), current=0, samples=steady(50))
    assert decision.upscale_factor_ceil == 1  # ceil(0 x 1.5) = 0 would forbid any step
    assert decision.replicas == 1


def test_the_count_stays_within_min_and_max_replicas() -> None:
    assert tick(scaling(max_replicas=4), current=3, samples=steady(100)).replicas == 4
    assert tick(scaling(min_replicas=2), current=2, samples=steady(0)).replicas == 2
    assert tick(scaling(min_replicas=5, max_replicas=10), current=3, samples=steady(0)).replicas == 5


def test_scaling_up_waits_for_the_lowest_recommendation_of_the_upscale_period() -> None:
    config = scaling(upscale_stabilization_period=60)
    held = tick(config, current=3, samples=steady(10), history=[Recommendation(NOW - 60, 3)])
    assert held.recommendation == 5  # limited by the factor: ceil(3 x 1.5)
    assert (held.upscale_stabilization_ceil, held.replicas) == (3, 3)
    partly = tick(config, current=3, samples=steady(10), history=[Recommendation(NOW - 30, 4)])
    assert partly.replicas == 4
    free = tick(config, current=3, samples=steady(10), history=[Recommendation(NOW - 61, 3)])
    assert free.replicas == 5


def test_scaling_down_waits_for_the_highest_recommendation_of_the_downscale_period() -> None:
    config = scaling(downscale_stabilization_period=300)
    held = tick(config, current=8, samples=steady(0), history=[Recommendation(NOW - 300, 9)])
    assert held.recommendation == 6  # ceil(8 x 0.75)
    assert (held.downscale_stabilization_floor, held.replicas) == (8, 8)  # 9, but never above current
    partly = tick(config, current=8, samples=steady(0),
                  history=[Recommendation(NOW - 301, 9), Recommendation(NOW - 200, 7)])
    assert partly.replicas == 7
    free = tick(config, current=8, samples=steady(0), history=[Recommendation(NOW - 301, 9)])
    assert free.replicas == 6


def test_after_the_start_the_count_holds_for_each_directions_period() -> None:
    config = scaling(downscale_stabilization_period=300, upscale_stabilization_period=60)
    assert tick(config, current=4, samples=steady(0), started_at=NOW - 100).replicas == 4
    assert tick(config, current=4, samples=steady(0), started_at=NOW - 300).replicas == 3
    assert tick(config, current=4, samples=steady(5), started_at=NOW - 30).replicas == 4
    assert tick(config, current=4, samples=steady(5), started_at=NOW - 60).replicas == 5


def simulate(config: AutoscalingConfig, in_flight: Callable[[float], float], ticks: range,
             current: int) -> dict[int, int]:
    """Run the scaler every tick over samples taken every 10 s; the replicas after each tick."""
    samples = [InFlightSample(t, in_flight(t)) for t in range(ticks.start - 600, ticks.stop, 10)]
    history: list[Recommendation] = []
    replicas = {}
    for now in ticks:
        decision = decide(config, now=now, current=current, samples=[s for s in samples if s.at <= now],
                          history=history, started_at=ticks.start - 3600)
        if decision.recommendation is not None:
            history = history_to_keep(config, now, [*history, Recommendation(now, decision.recommendation)])
        current = replicas[now] = decision.replicas
    return replicas


def test_an_async_api_scales_to_zero_after_a_whole_downscale_period_without_work_and_back_on_work() -> None:
    config = scaling(min_replicas=0, window=60, downscale_stabilization_period=300, upscale_stabilization_period=60)

    def work(t: float) -> float:
        return 1 if t <= 0 else 0 if t < 400 else 12  # one request until t=0, none, then 12 from t=400

    replicas = simulate(config, work, range(10, 480, 10), current=1)
    # The sample of t=0 leaves the window at t=60; from then on every recommendation is 0, and the
    # last 1 (t=50) leaves the downscale period at t=360.
    assert [replicas[t] for t in (10, 50, 60, 350)] == [1, 1, 1, 1]
    assert replicas[360] == 0
    assert all(replicas[t] == 0 for t in range(360, 400, 10))
    # Work at zero replicas: one at once, not after the upscale period.
    assert replicas[400] == 1
    # Then the upscale period holds 1 while it still holds the recommendation of t=400 (1).
    assert all(replicas[t] == 1 for t in range(400, 470, 10))
    assert replicas[470] == 2


def test_work_at_zero_replicas_wakes_the_api_even_just_after_the_start() -> None:
    decision = tick(scaling(min_replicas=0), current=0, samples=steady(3), started_at=NOW - 1)
    assert decision.replicas == 1


def test_a_trickle_of_work_keeps_one_replica_of_an_api_that_may_scale_to_zero() -> None:
    decision = tick(scaling(min_replicas=0), current=1, samples=[InFlightSample(NOW, 0.01)])
    assert decision.replicas == 1


def test_each_decision_states_the_figures_that_led_to_it() -> None:
    decision = tick(scaling(target_replica_concurrency=2), current=2, samples=steady(10),
                    history=[Recommendation(NOW - 20, 2)])
    fields = decision.log_fields()
    assert fields["avg_in_flight"] == 10 and fields["raw_recommendation"] == 5
    assert fields["recommendation"] == 3  # ceil(2 x 1.5)
    assert fields["upscale_stabilization_ceil"] == 2 and fields["replicas"] == 2
    assert "upscale period" in fields["reason"]


def test_history_older_than_both_periods_is_dropped() -> None:
    config = scaling(downscale_stabilization_period=300, upscale_stabilization_period=60)
    history = [Recommendation(NOW - 301, 1), Recommendation(NOW - 300, 2), Recommendation(NOW, 3)]
    assert history_to_keep(config, NOW, history) == history[1:]


def test_a_ratio_that_floating_point_puts_a_hair_above_a_whole_number_is_that_number() -> None:
    decision = tick(scaling(target_replica_concurrency=0.7, upscale_tolerance=0), current=3, samples=steady(2.1))
    assert decision.raw is not None and decision.raw > 3  # 2.1 / 0.7 in floating point
    assert decision.replicas == 3


def test_a_count_above_a_lowered_max_replicas_comes_down_to_it_even_while_held() -> None:
    config = scaling(min_replicas=1, max_replicas=2)
    held = tick(config, current=5, samples=steady(5.0), started_at=NOW - 1)
    assert held.replicas == 2  # within the downscale period of the start, but max_replicas rules
    no_samples = tick(config, current=5, samples=[], history=[Recommendation(NOW - 10, 5)])
    assert no_samples.replicas == 2
