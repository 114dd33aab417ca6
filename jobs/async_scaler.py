"""How many worker nodes serve each AsyncAPI, from its queue: Cortex's algorithm on in-flight work.

An AsyncAPI's in-flight figure is its requests queued plus running, which its store counts exactly
(`jobs/async_counts.py`). Beat samples it at every step (`SLUICE_BEAT_INTERVAL`) and, every
`TICK_S`, asks `jobs/autoscaler.py` for the count between `min_replicas` and `max_replicas`, over the
samples of its `window` and the recommendations of its stabilisation periods; placement then puts
the API on that many nodes (`jobs/async_placement.py`). An API at zero nodes with a request in
flight is decided at once, not at the next tick: it gets one node within a beat step.

The samples and recommendations live in beat's process (one beat runs): a restarted beat starts with
none, and takes the API's placed nodes as its current count. The start-up hold of the algorithm
counts from the API's deploy, so a restart does not hold it again.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from foundation.api_registry import DeployedApi
from predictors_runtime.autoscaling_config import AutoscalingConfig

from .autoscaler import TICK_S, InFlightSample, Recommendation, decide, history_to_keep

log = logging.getLogger(__name__)


@dataclass
class _Track:
    """One API's samples and recommendations, and what was decided last."""

    deployed_at: float
    samples: deque[InFlightSample] = field(default_factory=deque)
    history: list[Recommendation] = field(default_factory=list)
    desired: int | None = None
    decided_at: float | None = None


@dataclass(frozen=True)
class Scale:
    """An API's node count as last decided, and the in-flight figure it was decided on."""

    desired: int
    in_flight: float


class AsyncScaler:
    """Per beat process: each AsyncAPI's node count, one decision a tick."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self._tick_s = tick_s
        self._tracks: dict[str, _Track] = {}

    def wanted(self, api: DeployedApi, config: AutoscalingConfig, in_flight: int, placed: int, now: float) -> int:
        """The nodes `api` should have now; `in_flight` its requests queued and running, `placed` the
        nodes it has (the current count after a restart of beat)."""
        track = self._tracks.get(api.name)
        if track is None or track.deployed_at != api.deployed_at:  # first seen, or redeployed: its config may differ
            track = self._tracks[api.name] = _Track(api.deployed_at, desired=None if track is None else track.desired)
        track.samples.append(InFlightSample(now, float(in_flight)))
        while track.samples and track.samples[0].at <= now - config.window:
            track.samples.popleft()
        current = track.desired if track.desired is not None else placed
        woken = current == 0 and in_flight > 0
        if track.decided_at is not None and now - track.decided_at < self._tick_s and not woken:
            return current
        decision = decide(config, now=now, current=current, samples=list(track.samples), history=track.history,
                          started_at=api.deployed_at)
        if decision.recommendation is not None:
            track.history = history_to_keep(config, now, [*track.history, Recommendation(now, decision.recommendation)])
        if decision.replicas != current:
            log.info("async api %s: %d -> %d node(s) (%s)", api.name, current, decision.replicas, decision.reason,
                     extra={"api_name": api.name, **decision.log_fields()})
        track.desired, track.decided_at = decision.replicas, now
        return decision.replicas

    def scale(self, api_name: str) -> Scale | None:
        """What was last decided for the API (None before its first decision)."""
        track = self._tracks.get(api_name)
        if track is None or track.desired is None:
            return None
        in_flight = sum(s.in_flight for s in track.samples) / len(track.samples) if track.samples else 0.0
        return Scale(track.desired, in_flight)

    def forget(self, api_name: str) -> None:
        """The API is gone."""
        self._tracks.pop(api_name, None)
