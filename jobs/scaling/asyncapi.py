"""How many worker nodes serve each AsyncAPI, from its queue: Cortex's algorithm on in-flight work.

An AsyncAPI's in-flight figure is its requests queued plus running, which its store counts exactly
(`jobs/asyncapi/counts.py`). Beat samples it at every step (`SLUICE_BEAT_INTERVAL`) and, every
`TICK_S`, the scaler (`jobs/scaling/scaler.py`) decides the count between `min_replicas` and
`max_replicas`; placement then puts the API on that many nodes (`jobs/placement/asyncapi.py`). An API
at zero nodes with a request in flight is decided at once, not at the next tick: it gets one node
within a beat step. A restarted beat takes the API's placed nodes as its current count.
"""

from __future__ import annotations

from jobs.scaling.algorithm import TICK_S
from jobs.scaling.scaler import Scale, Scaler

__all__ = ["AsyncScaler", "Scale"]


class AsyncScaler(Scaler):
    """Per beat process: each AsyncAPI's node count, one decision a tick."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        super().__init__("async api", "node(s)", tick_s)

