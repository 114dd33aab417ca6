"""Access to the per-app services and collaborators from request handlers.

`create_app` puts them in `app.extensions`; a fast test may put fakes there instead
(`foundation.memory`). Each is typed as the Protocol callers use.
"""

from __future__ import annotations

from typing import cast

from flask import current_app

from foundation.api_registry import ApiRegistry
from foundation.figure_store import FigureStore
from foundation.log_streams import LogStreams
from foundation.replica_directory import ReplicaDirectory
from jobs.services import Services

SERVICES = "sluice"
REGISTRY = "sluice.registry"
REPLICAS = "sluice.replicas"
LOG_STREAMS = "sluice.log_streams"
FIGURE_STORE = "sluice.figure_store"


def services() -> Services:
    return cast(Services, current_app.extensions[SERVICES])


def registry() -> ApiRegistry:
    return cast(ApiRegistry, current_app.extensions[REGISTRY])


def replica_directory() -> ReplicaDirectory:
    """The realtime replicas' records (read to list and explain an API's replicas)."""
    return cast(ReplicaDirectory, current_app.extensions[REPLICAS])


def log_streams() -> LogStreams:
    """The log streams `sluice logs` reads."""
    return cast(LogStreams, current_app.extensions[LOG_STREAMS])


def figure_store() -> FigureStore:
    """Where every process's figures are summed (what `/metrics` reads)."""
    return cast(FigureStore, current_app.extensions[FIGURE_STORE])
