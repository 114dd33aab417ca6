"""The Flask app factory: nothing connects until a request needs it."""

from __future__ import annotations

from flask import Flask, Response, request
from flask.json.provider import DefaultJSONProvider
from werkzeug.middleware.proxy_fix import ProxyFix

from foundation import figure_sink as process_figures
from foundation.api_registry import RedisApiRegistry
from foundation.figure_store import RedisFigureStore
from foundation.figures import Recorder
from foundation.limits import MAX_BUNDLE_BYTES
from foundation.log_streams import RedisLogStreams
from foundation.predictor_builds import RedisPredictorBuilds
from foundation.replica_directory import RedisReplicaDirectory
from foundation.settings import Settings
from jobs.celery_app import create_celery
from jobs.services import Services
from jobs.wiring import init_services

from . import apis, async_api, auth, batch, browser, context, fallback, health, logs, promises, tasks
from .async_front import AsyncSubmitFront
from .errors import register_error_handlers
from .metrics import HTTP_RESPONSES


def create_app(settings: Settings | None = None, services: Services | None = None,
               recorder: Recorder | None = None) -> Flask:
    """The API app. `services` may be given ready-made (fast tests hand in an in-memory job store),
    and `recorder` too (a fast test's counts into a `foundation.memory.MemoryFigureStore`); by
    default they are connected from `settings`. The registry, the replica directory, the log
    streams and the figure store use the services' Redis client; a fast test may replace them in
    `app.extensions` (`api/context.py`)."""
    settings = services.settings if services is not None else settings or Settings.from_env()
    app = Flask("sluice", static_folder=None)  # no static files: every route is Sluice's own
    if isinstance(app.json, DefaultJSONProvider):
        app.json.sort_keys = False  # answers keep the order their models give
    if services is None:  # this process's, from its one wiring point
        services = init_services(create_celery(settings), settings)
    app.extensions[context.SERVICES] = services
    app.extensions[context.REGISTRY] = RedisApiRegistry(services.redis)
    app.extensions[context.REPLICAS] = RedisReplicaDirectory(services.redis)
    app.extensions[context.LOG_STREAMS] = RedisLogStreams(services.redis)
    app.extensions[context.FIGURE_STORE] = RedisFigureStore(services.redis)
    app.extensions[context.PREDICTOR_BUILDS] = RedisPredictorBuilds(services.redis)
    # This process's figures (jobs submitted, responses) go to Redis in the background; /metrics
    # shows the sums of every process (api/metrics.py).
    app.extensions["sluice.figures"] = recorder = (recorder or Recorder.for_url(settings.redis_address)).start()
    process_figures.install(recorder)

    # API keys first: an unauthenticated request gets no further (a no-op without keys).
    app.before_request(auth.request_guard(settings))

    @app.before_request
    def _limit_body() -> None:
        # Deploys carry a whole project; everything else is bounded by the job body limit.
        limit = MAX_BUNDLE_BYTES + 1024 * 1024 if request.path == "/apis" else settings.max_body_bytes
        request.max_content_length = limit

    @app.after_request
    def _count(response: Response) -> Response:
        HTTP_RESPONSES.labels(status=f"{response.status_code // 100}xx").inc()
        return response

    # fallback's `/<name>` last: it answers only what no other route (and no replica) takes.
    app.url_map.converters["unreserved"] = fallback.UnreservedName
    for module in (health, browser, apis, batch, tasks, logs, async_api, fallback):
        app.register_blueprint(module.blueprint)
    register_error_handlers(app)
    # Last registered, so first to run after a view: a write's answer waits for Redis's replicas.
    promises.confirm_writes(app)
    # The proxy says whether its client came over TLS (it replaces any X-Forwarded-Proto the client
    # sent), so the addresses answered (an API's endpoint) are https:// when they should be. Only
    # the scheme is taken: the client's address and host stay what the connection says. AsyncAPI
    # submissions, which answer no address, are answered before it and Flask (`api/async_front.py`).
    flask_wsgi = ProxyFix(app.wsgi_app, x_for=0, x_proto=1, x_host=0, x_port=0, x_prefix=0)
    app.wsgi_app = AsyncSubmitFront(app, flask_wsgi, settings)  # type: ignore[method-assign]
    return app
