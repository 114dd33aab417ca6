"""How many replicas an API should run, from the requests in flight: Cortex's algorithm, pure.

Every tick (`TICK_S`, 10 s) the scaler averages the API's in-flight samples of the last `window`
and divides by `target_replica_concurrency`. That raw figure, rounded up, is the recommendation,
unless it lies within the tolerance band around the current count (then the count stays). One
step may shrink the API to `ceil(current x max_downscale_factor)` and grow it to
`ceil(current x max_upscale_factor)`, but one replica down or up is always allowed; the result is
clamped to [min_replicas, max_replicas] and recorded. Then it is stabilised against the
recorded history: going down, never below the highest recommendation of the last
`downscale_stabilization_period`; going up, never above the lowest of the last
`upscale_stabilization_period` (neither bound passing the current count). For a period after the
scaler starts, it does not move in that period's direction at all.

Two cases are this project's reading of Cortex: before anything was recommended and with no
sample yet, the answer is `init_replicas`; and an API at zero replicas with work in flight gets
one replica at once, as Cortex's activator woke an API, not after the upscale period.

Nothing here reads a clock, Redis or the proxy: the caller passes `now`, the samples and the
history, records `Decision.recommendation`, and logs `Decision.log_fields()`. Tests drive it with
hand-computed series.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from predictors_runtime.autoscaling_config import TICK_S, AutoscalingConfig

__all__ = ["TICK_S", "Decision", "InFlightSample", "Recommendation", "decide", "history_to_keep"]


class InFlightSample(NamedTuple):
    """The API's requests in flight (queued plus running, all replicas together) at one time."""

    at: float
    in_flight: float


class Recommendation(NamedTuple):
    """A count the scaler recommended at one time, before stabilisation (what Cortex recorded)."""

    at: float
    replicas: int


@dataclass(frozen=True)
class Decision:
    """One tick's answer, with every figure that led to it so a log line can state them."""

    replicas: int  # what the API should run now
    current: int
    reason: str
    # None when the window held no sample: nothing was computed, and nothing is to be recorded.
    avg_in_flight: float | None = None
    raw: float | None = None  # avg_in_flight / target, before rounding
    # After tolerance, factor limits and clamping; the caller records it in the history.
    recommendation: int | None = None
    downscale_factor_floor: int | None = None
    upscale_factor_ceil: int | None = None
    downscale_stabilization_floor: int | None = None
    upscale_stabilization_ceil: int | None = None

    def log_fields(self) -> dict[str, Any]:
        """The decision as the `extra` fields of one JSON log line."""
        return {
            "current_replicas": self.current,
            "avg_in_flight": self.avg_in_flight,
            "raw_recommendation": self.raw,
            "recommendation": self.recommendation,
            "downscale_factor_floor": self.downscale_factor_floor,
            "upscale_factor_ceil": self.upscale_factor_ceil,
            "downscale_stabilization_floor": self.downscale_stabilization_floor,
            "upscale_stabilization_ceil": self.upscale_stabilization_ceil,
            "replicas": self.replicas,
            "reason": self.reason,
        }


def average_in_flight(config: AutoscalingConfig, now: float, samples: Iterable[InFlightSample]) -> float | None:
    """Mean of the samples taken in the last `window` (after `now - window`), None if there are none."""
    inside = [sample.in_flight for sample in samples if sample.at > now - config.window]
    return sum(inside) / len(inside) if inside else None


def history_to_keep(
    config: AutoscalingConfig, now: float, history: Iterable[Recommendation]
) -> list[Recommendation]:
    """The recommendations a later tick can still look at (the longer period's); the rest can go."""
    keep_for = max(config.downscale_stabilization_period, config.upscale_stabilization_period)
    return [rec for rec in history if now - rec.at <= keep_for]


def decide(
    config: AutoscalingConfig,
    *,
    now: float,
    current: int,
    samples: Sequence[InFlightSample],
    history: Sequence[Recommendation],
    started_at: float,
) -> Decision:
    """The replica count for this tick.

    `current` is the count the API runs (was last asked to run); `history` the recommendations of
    earlier ticks; `started_at` when this scaler began deciding for the API (its deploy), which
    holds the count still for each stabilisation period after it, as Cortex did. Whatever holds
    the count still, the answer stays within [min_replicas, max_replicas] (a redeploy may have
    moved them past the current count).
    """
    decision = _decide(config, now=now, current=current, samples=samples, history=history, started_at=started_at)
    bounded = min(max(decision.replicas, config.min_replicas), config.max_replicas)
    if bounded == decision.replicas:
        return decision
    return replace(decision, replicas=bounded, reason=f"{decision.reason}; kept within min_replicas..max_replicas")


def _decide(
    config: AutoscalingConfig,
    *,
    now: float,
    current: int,
    samples: Sequence[InFlightSample],
    history: Sequence[Recommendation],
    started_at: float,
) -> Decision:
    avg = average_in_flight(config, now, samples)
    if avg is None:
        if not history:
            return Decision(replicas=config.init_replicas, current=current, reason="no in-flight sample yet")
        return Decision(replicas=current, current=current, reason="no in-flight sample in the window")

    raw = avg / config.target_replica_concurrency
    # Rounded first: 4.9 / 0.7 is 7.000000000000001 in floating point, and is 7 replicas, not 8.
    recommendation = math.ceil(round(raw, 9))
    if current * (1 - config.downscale_tolerance) < raw < current:
        recommendation = current
    if current < raw < current * (1 + config.upscale_tolerance):
        recommendation = current
    # One replica down or up is always allowed, whatever the factors.
    factor_floor = min(current - 1, math.ceil(current * config.max_downscale_factor))
    factor_ceil = max(current + 1, math.ceil(current * config.max_upscale_factor))
    recommendation = min(max(recommendation, factor_floor), factor_ceil)
    recommendation = min(max(recommendation, config.min_replicas), config.max_replicas)

    limited = Decision(
        replicas=recommendation, current=current, reason="as recommended", avg_in_flight=avg, raw=raw,
        recommendation=recommendation, downscale_factor_floor=factor_floor, upscale_factor_ceil=factor_ceil,
    )
    if current == 0 and recommendation > 0:
        return replace(limited, reason="work in flight at zero replicas")

    # The history includes this tick's recommendation, as Cortex recorded it before stabilising.
    recent = [*history, Recommendation(now, recommendation)]
    if recommendation < current:
        floor = min(current, max(r.replicas for r in recent if now - r.at <= config.downscale_stabilization_period))
        limited = replace(limited, downscale_stabilization_floor=floor)
        if now - started_at < config.downscale_stabilization_period:
            return replace(limited, replicas=current, reason="no scaling down within the downscale period of the start")
        if recommendation < floor:
            return replace(limited, replicas=floor,
                           reason="held up by a higher recommendation within the downscale period")
    elif recommendation > current:
        ceil = max(current, min(r.replicas for r in recent if now - r.at <= config.upscale_stabilization_period))
        limited = replace(limited, upscale_stabilization_ceil=ceil)
        if now - started_at < config.upscale_stabilization_period:
            return replace(limited, replicas=current, reason="no scaling up within the upscale period of the start")
        if recommendation > ceil:
            return replace(limited, replicas=ceil,
                           reason="held down by a lower recommendation within the upscale period")
    return limited
