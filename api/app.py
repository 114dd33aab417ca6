"""The Flask app factory: nothing connects until a request needs it."""

from __future__ import annotations

from flask import Flask, request

from jobs.celery_app import create_celery
from jobs.services import Services
from foundation.figures import Recorder
from foundation.settings import Settings
from foundation import figure_sink as process_figures
from foundation.limits import MAX_BUNDLE_BYTES

from . import apis, auth, batch, fallback, health, logs
from .errors import register_error_handlers
from .metrics import HTTP_RESPONSES
from foundation.api_registry import ApiRegistry


def create_app(settings: Settings | None = None, services: Services | None = None) -> Flask:
    """The API app. `services` may be given ready-made (fast tests hand in an in-memory job store);
    by default they are connected from `settings`."""
    settings = services.settings if services is not None else settings or Settings.from_env()
    app = Flask("sluice", static_folder=None)  # no static files: every route is Sluice's own
    app.json.sort_keys = False
    if services is None:
        services = Services.connect(settings, create_celery(settings))
    app.extensions["sluice"] = services
    app.extensions["sluice.registry"] = ApiRegistry(services.redis)
    # This process's figures (jobs submitted, responses) go to Redis in the background; /metrics
    # shows the sums of every process (api/metrics.py).
    app.extensions["sluice.figures"] = recorder = Recorder.for_url(settings.redis_url).start()
    process_figures.install(recorder)

    # API keys first: an unauthenticated request gets no further (a no-op without keys).
    app.before_request(auth.request_guard(settings))

    @app.before_request
    def _limit_body() -> None:
        # Deploys carry a whole project; everything else is bounded by the job body limit.
        limit = MAX_BUNDLE_BYTES + 1024 * 1024 if request.path == "/apis" else settings.max_body_bytes
        request.max_content_length = limit

    @app.after_request
    def _count(response):
        HTTP_RESPONSES.labels(status=f"{response.status_code // 100}xx").inc()
        return response

    # fallback's `/<name>` last: it answers only what no other route (and no replica) takes.
    app.url_map.converters["unreserved"] = fallback.UnreservedName
    for module in (health, apis, batch, logs, fallback):
        app.register_blueprint(module.blueprint)
    register_error_handlers(app)
    return app
