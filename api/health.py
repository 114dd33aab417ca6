"""Management endpoints: `/healthz`, `/metrics`, `/openapi.json`."""

from __future__ import annotations

import redis
from flask import Blueprint, Response, current_app, jsonify
from flask.typing import ResponseReturnValue

from foundation.errors import NotReady

from .context import figure_store, registry, replica_directory, services
from .metrics import CONTENT_TYPE_LATEST, exposition
from .openapi import openapi_document
from .schemas import Health

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
def healthz() -> ResponseReturnValue:
    """Ready when Redis answers; also says how many worker nodes are alive."""
    import time

    try:
        services().redis.ping()
        nodes = services().placement.live_nodes(time.time())
    except redis.RedisError as e:
        raise NotReady(f"redis is not reachable: {e}") from e
    return Health(status="ok", worker_nodes=nodes).response()


@blueprint.get("/metrics")
def metrics() -> ResponseReturnValue:
    """Sluice's figures, summed over every process on every host (api/metrics.py)."""
    return Response(exposition(services(), figure_store(), registry(), replica_directory()),
                    content_type=CONTENT_TYPE_LATEST)  # as given: `mimetype` would add a second charset


@blueprint.get("/openapi.json")
def openapi() -> ResponseReturnValue:
    return jsonify(openapi_document(current_app))
