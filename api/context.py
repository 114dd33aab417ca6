"""Access to the per-app services and collaborators from request handlers.

`create_app` puts them in `app.extensions`; a fast test may put fakes there instead
(`foundation.memory`). Each is typed as the Protocol callers use.
"""

from __future__ import annotations

from typing import Any, cast

from flask import current_app

from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.errors import ApiNotFound
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
    """The API a request to `/<name>` goes to: kept by each process while the registry's generation
    holds still (`ApiNotFound` is never kept: a new deploy is routed at once)."""
    return route_in(current_app.extensions, name)


def route_in(extensions: dict[str, Any], name: str) -> DeployedApi:
    """`routed_api` from an app's extensions, for a caller outside any request context (the WSGI
    front of `api/async_front.py`): the same kept routes.

    A request reads the registry's generation (a small counter, one round trip) instead of the API's
    deployment (its JSON, parsed): every deploy and delete raises the counter, so a route kept by any
    API process is dropped the moment another process changes the API, and a deleted API answers 404
    from every process at once. The generation is read before the deployment, so a deploy between the
    two leaves the route kept at the older generation: read again on the next request."""
    return read_route(extensions, name)[1]


def read_route(extensions: dict[str, Any], name: str) -> tuple[int, DeployedApi]:
    """`route_in`, with the registry generation the route holds at."""
    api_registry = cast(ApiRegistry, extensions[REGISTRY])
    routes: dict[str, tuple[int, DeployedApi]] = extensions.setdefault(ROUTES, {})
    generation = api_registry.generation()
    kept = routes.get(name)
    if kept is not None and kept[0] == generation:
        return kept
    try:
        api = api_registry.get(name)
    except ApiNotFound:
        routes.pop(name, None)  # a deleted API's route is not kept for `kept_route` either
        raise
    routes[name] = (generation, api)
    return generation, api


def kept_route(extensions: dict[str, Any], name: str) -> tuple[int, DeployedApi] | None:
    """The route this process keeps for `name` and the generation it was read at, without asking the
    registry whether it still holds: for a caller whose write is refused unless the registry is
    still at that generation (an AsyncAPI submission, `jobs/asyncapi/lua/submit.lua`)."""
    routes: dict[str, tuple[int, DeployedApi]] = extensions.get(ROUTES, {})
    return routes.get(name)
