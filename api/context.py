"""Access to the per-app services and collaborators from request handlers.

`create_app` puts them in `app.extensions`; a fast test may put fakes there instead
(`foundation.memory`). Each is typed as the Protocol callers use.
"""

from __future__ import annotations

import time
from typing import Any, cast

from flask import current_app

from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.figure_store import FigureStore
from foundation.log_streams import LogStreams
from foundation.predictor_builds import PredictorBuilds
from foundation.replica_directory import ReplicaDirectory
from jobs.services import Services

SERVICES = "sluice"
REGISTRY = "sluice.registry"
REPLICAS = "sluice.replicas"
LOG_STREAMS = "sluice.log_streams"
FIGURE_STORE = "sluice.figure_store"
PREDICTOR_BUILDS = "sluice.predictor_builds"
ROUTES = "sluice.routes"
# How old this process's view of an API may be when it routes a request to `/<name>`: one registry
# read a second per API instead of one per request. A deploy or delete in this process is seen at
# once; one in another process within the second. A request that view sends to an AsyncAPI deleted
# meanwhile is refused by its store's check (`jobs/asyncapi/store.py` `submit`); one sent there although
# the API is now of another kind is failed by its node, saying so.
ROUTE_TTL_S = 1.0


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


def predictor_builds() -> PredictorBuilds:
    """The last failed build of each API's predictor on a worker node (`sluice get` shows it)."""
    return cast(PredictorBuilds, current_app.extensions[PREDICTOR_BUILDS])


def routed_api(name: str) -> DeployedApi:
    """The API a request to `/<name>` goes to, read from the registry at most once a `ROUTE_TTL_S` per
    process (`ApiNotFound` is never kept: a new deploy is routed at once)."""
    return route_in(current_app.extensions, name)


def route_in(extensions: dict[str, Any], name: str) -> DeployedApi:
    """`routed_api` from an app's extensions, for a caller outside any request context (the WSGI
    front of `api/async_front.py`): the same kept routes."""
    routes: dict[str, tuple[float, DeployedApi]] = extensions.setdefault(ROUTES, {})
    now = time.monotonic()
    kept = routes.get(name)
    if kept is not None and now - kept[0] < ROUTE_TTL_S:
        return kept[1]
    api = cast(ApiRegistry, extensions[REGISTRY]).get(name)
    routes[name] = (now, api)
    return api


def forget_route(name: str) -> None:
    """An API deployed or deleted by this process: its next request reads the registry."""
    current_app.extensions.get(ROUTES, {}).pop(name, None)
