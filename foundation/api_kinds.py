"""The kinds of API a cortex.yaml may declare, spelled as Cortex spelled them.

One definition for every part: the config schema, the HTTP API, placement, the launchers and
the CLI compare an API's `kind` (a plain string in stored records and JSON) with these members,
which are equal to their strings. Importable by a client-only install (no dependency).
"""

from __future__ import annotations

from enum import StrEnum


class ApiKind(StrEnum):
    BATCH = "BatchAPI"
    REALTIME = "RealtimeAPI"
    TASK = "TaskAPI"
    ASYNC = "AsyncAPI"
    TRAFFIC_SPLITTER = "TrafficSplitter"


# Every kind, in the order the docs list them.
KINDS: tuple[ApiKind, ...] = tuple(ApiKind)
# The kinds with a predictor (or task) of their own; a TrafficSplitter only shares requests among
# RealtimeAPIs, at the proxy.
PREDICTOR_KINDS: tuple[ApiKind, ...] = (ApiKind.BATCH, ApiKind.REALTIME, ApiKind.TASK, ApiKind.ASYNC)
# The kinds with replicas (or nodes) that an `autoscaling` block scales.
SCALED_KINDS: tuple[ApiKind, ...] = (ApiKind.REALTIME, ApiKind.ASYNC)
# The kinds a worker node builds predictors for (an environment is warmed for them on worker hosts).
WORKER_KINDS: tuple[ApiKind, ...] = (ApiKind.BATCH, ApiKind.TASK, ApiKind.ASYNC)
