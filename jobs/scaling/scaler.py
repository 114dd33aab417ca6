"""One beat process's scaler: Cortex's algorithm (`jobs/scaling/algorithm.py`) kept running per API.

Beat hands it an API's in-flight figure at every step (`SLUICE_BEAT_INTERVAL`); it keeps the
samples of the API's `window` and the recommendations of its stabilisation periods, and every
`TICK_S` decides the count between `min_replicas` and `max_replicas`. An API at zero with work in
flight is decided at once, not at the next tick (only an AsyncAPI can be at zero).

What it keeps lives in beat's process (one beat runs): a restarted beat starts with no samples,
and takes the count the caller says the API has (an AsyncAPI's placed nodes, a RealtimeAPI's last
recorded decision) as its current one. The start-up hold of the algorithm counts from the API's
deploy, so a restart does not hold it again. An AsyncAPI's worker nodes (`jobs/scaling/asyncapi.py`)
and a RealtimeAPI's replicas (`jobs/scaling/realtime.py`) are both scaled by it.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from foundation.api_registry import DeployedApi
from jobs.scaling.algorithm import TICK_S, Decision, InFlightSample, Recommendation, decide, history_to_keep
from predictors_runtime.autoscaling_config import AutoscalingConfig

log = logging.getLogger(__name__)


@dataclass
class _Track:
    """One API's samples and recommendations, and what was decided last."""

    deployed_at: float
    samples: deque[InFlightSample] = field(default_factory=deque)
    history: list[Recommendation] = field(default_factory=list)
    desired: int | None = None
    decided_at: float | None = None
    decision: Decision | None = None


@dataclass(frozen=True)
class Scale:
    """An API's count as last decided, the in-flight figure it was decided on (the mean of the
    window's samples), and when."""

    desired: int
    in_flight: float
    decided_at: float


class Scaler:
    """Per beat process: each API's replica count, one decision a tick.

    `kind` and `unit` only word the log line of a decision ("async api x: 1 -> 2 node(s)").
    """

    def __init__(self, kind: str, unit: str, tick_s: float = TICK_S) -> None:
        self._kind, self._unit = kind, unit
        self._tick_s = tick_s
        self._tracks: dict[str, _Track] = {}

    def wanted(self, api: DeployedApi, config: AutoscalingConfig, in_flight: float | None, current: int,
               now: float) -> int:
        """The count `api` should have now. `in_flight` is its requests queued and running now (None:
        not measured this step, no sample); `current` the count it has, used until this process
        has decided one (after a restart of beat)."""
        track = self._tracks.get(api.name)
        if track is None or track.deployed_at != api.deployed_at:  # first seen, or redeployed: its config may differ
            track = self._tracks[api.name] = _Track(api.deployed_at, desired=None if track is None else track.desired)
        if in_flight is not None:
            track.samples.append(InFlightSample(now, float(in_flight)))
        while track.samples and track.samples[0].at <= now - config.window:
            track.samples.popleft()
        current = track.desired if track.desired is not None else current
        if track.desired is None and not track.samples:  # nothing measured yet: nothing to decide on
            return current
        woken = current == 0 and bool(in_flight)
        if track.decided_at is not None and now - track.decided_at < self._tick_s and not woken:
            return current
        decision = decide(config, now=now, current=current, samples=list(track.samples), history=track.history,
                          started_at=api.deployed_at)
        if decision.recommendation is not None:
            track.history = history_to_keep(config, now, [*track.history, Recommendation(now, decision.recommendation)])
        # One line per decision with every figure it used; at info level when the count moves.
        level = logging.INFO if decision.replicas != current else logging.DEBUG
        log.log(level, "%s %s: %d -> %d %s (%s)", self._kind, api.name, current, decision.replicas, self._unit,
                decision.reason, extra={"api_name": api.name, **decision.log_fields()})
        track.desired, track.decided_at, track.decision = decision.replicas, now, decision
        return decision.replicas

    def scale(self, api_name: str) -> Scale | None:
        """What was last decided for the API (None before its first decision)."""
        track = self._tracks.get(api_name)
        if track is None or track.desired is None or track.decided_at is None:
            return None
        in_flight = sum(s.in_flight for s in track.samples) / len(track.samples) if track.samples else 0.0
        return Scale(track.desired, in_flight, track.decided_at)

    def names(self) -> set[str]:
        """The APIs it keeps anything for."""
        return set(self._tracks)

    def forget(self, api_name: str) -> None:
        """The API is gone."""
        self._tracks.pop(api_name, None)
