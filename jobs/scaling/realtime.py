"""How many replicas each RealtimeAPI should run, from the requests in flight at the proxies.

Each proxy samples its APIs' requests in flight (running at their replicas plus queued at the
proxy) several times a second and publishes running totals (`foundation/proxy_load.py`). At every
beat step this reads them all, takes each API's mean since the previous step summed over the live
proxies as one sample, and hands it to the scaler (`jobs/scaling/scaler.py`: Cortex's algorithm, one
decision every `TICK_S`). Each decision is written to the scale book
(`foundation/replica_scale.py`), where placement reads how many replicas to run.

A restarted beat takes the book's last decision as the API's current count (an API with none is at
its `init_replicas`), and decides nothing until it has measured something: its first step only sets
the proxies' baselines, and while no proxy is live no sample is taken, so the count holds. A
deleted API is forgotten, here and in the book.
"""

from __future__ import annotations

import logging

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry
from foundation.errors import ConfigError
from foundation.proxy_load import LOAD_TTL_S, InFlightMeter, ProxyLoadBook
from foundation.replica_scale import ReplicaScale, ScaleBook
from jobs.scaling.algorithm import TICK_S
from jobs.scaling.config import autoscaling_of
from jobs.scaling.scaler import Scaler

log = logging.getLogger(__name__)


class RealtimeScaling:
    """Per beat process: the in-flight meter over the proxies and the scaler of every RealtimeAPI."""

    def __init__(self, tick_s: float = TICK_S, ttl_s: float = LOAD_TTL_S) -> None:
        self._scaler = Scaler("realtime api", "replica(s)", tick_s)
        self._meter = InFlightMeter(ttl_s)

    def step(self, registry: ApiRegistry, loads: ProxyLoadBook, book: ScaleBook, now: float) -> dict[str, int]:
        """Sample, decide where a tick is due, record the decisions; returns each API's count now."""
        figures = self._meter.read(loads.all(), now)
        recorded = book.all()
        apis = [api for api in registry.all() if api.kind == ApiKind.REALTIME]
        for gone in (recorded.keys() | self._scaler.names()) - {api.name for api in apis}:
            book.forget(gone)
            self._scaler.forget(gone)
        counts: dict[str, int] = {}
        for api in apis:
            try:
                config = autoscaling_of(api)
            except ConfigError as e:  # stored by another version: the others are still scaled
                log.warning("realtime api %s: its autoscaling cannot be read; not scaled: %s", api.name, e)
                continue
            last = recorded.get(api.name)
            current = last.desired if last is not None else config.init_replicas
            in_flight = None if figures is None else figures.get(api.name, 0.0)
            counts[api.name] = self._scaler.wanted(api, config, in_flight, current, now)
            scale = self._scaler.scale(api.name)
            if scale is not None and scale.decided_at == now:
                book.set(api.name, ReplicaScale(scale.desired, scale.in_flight, scale.decided_at))
        return counts
