"""Management endpoints: `/healthz`, `/metrics`, `/openapi.json`."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from predictors_runtime.errors import NotReady

from .context import services
from .openapi import openapi_document

blueprint = Blueprint("health", __name__)


@blueprint.get("/healthz")
def healthz():
    """Ready when Redis answers; also says how many worker nodes are alive."""
    import time

    try:
        services().redis.ping()
        nodes = services().placement.live_nodes(time.time())
    except Exception as e:
        raise NotReady(f"redis is not reachable: {e}") from e
    return jsonify({"status": "ok", "worker_nodes": nodes})


@blueprint.get("/metrics")
def metrics():
    return Response(generate_latest(), mimetype=CONTENT_TYPE_LATEST)


@blueprint.get("/openapi.json")
def openapi():
    return jsonify(openapi_document())
