"""One realtime replica process: a Flask app serving `GET` and `POST /<api_name>` for one API.

A replica is `gunicorn 'api.realtime:create_replica_app()'` started by the launcher (`sluice
serve`), without `--preload`: each gunicorn worker runs the factory after the fork and builds
its own predictor, in a background thread, so that the process answers at once from its first
second. Until the predictor is built, every request gets 503 `not_ready`; once built the
process leaves a readiness marker (`foundation/replica_directory.py`) and `GET /<api>` answers 200 when every
process of the replica has one. A predictor that fails to build leaves a failure marker and
the process goes on answering 503 with the reason, instead of crash-looping.

How it is launched (`sluice/replica_process.py`): `processes_per_replica` workers; the `sync`
worker class when a process serves one request at a time, `gthread` with `--threads
threads_per_process` otherwise, and gevent with server-side batching: each request waiting in
a batch is a greenlet, the batch runs on the event loop's thread, and a batch is at most
`threads_per_process` requests (config checks `max_batch_size` against it). `post_predict`
runs on the request's own thread (or greenlet) after the answer has been written (werkzeug's
`call_on_close`), so a slow one holds it, as in Cortex.

The request path is kept lean (it is measured against a bare Flask app): nothing is inspected
or looked up per request beyond the request itself, and nothing leaves the process on the request's
thread (log lines reach the API's log stream from a background thread, `foundation/log_streams.py`).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from flask import Flask, request
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Request, Response

from foundation import figure_sink as process_figures
from foundation.api_registry import DeployedApi
from foundation.errors import ConfigError, SluiceError
from foundation.figures import REALTIME_BATCH_SIZE, RealtimeFigures, Recorder
from foundation.json_logs import configure_json_logging, labelled
from foundation.log_streams import LogStreams, install_api_log_handler
from foundation.memory_guard import GuardTripped, MemoryGuard
from foundation.printed_lines import print_to_log
from foundation.replica_directory import ReadinessMarkers
from foundation.settings import Settings
from predictors_runtime.batching import BatchFailed
from predictors_runtime.config import ApiConfig
from predictors_runtime.loader import error_text, one_line
from predictors_runtime.payloads import FormPayload, close_payload, parse_payload
from predictors_runtime.realtime_predictor import RealtimePredictor, RequestArgs
from predictors_runtime.responses import json_response, to_response

from .errors import with_exception_headers
from .schemas import Readiness

log = logging.getLogger("sluice.realtime")

REQUEST_ID_HEADER = "X-Request-ID"
DEADLINE_HEADER = "X-Sluice-Deadline-Ms"
_REQUEST_ID_KEY = "sluice.request_id"  # in the WSGI environ, for the error handlers
_STARTED_KEY = "sluice.started"  # in the WSGI environ: when serving began, for the figures


@dataclass(frozen=True)
class ReplicaSettings:
    """What a replica process is told by its launcher (the `SLUICE_REPLICA_*` variables)."""

    api: DeployedApi
    project_dir: Path      # the unpacked project folder (gunicorn's cwd)
    state_dir: Path        # where the readiness markers go
    replica_id: str = ""
    api_url: str = ""      # Sluice's public URL, for predictors that call other APIs
    sluice: Settings = field(default_factory=Settings)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReplicaSettings:
        env = os.environ if env is None else env

        def required(name: str) -> str:
            value = env.get(name)
            if not value:
                raise ConfigError(f"{name} is not set: a replica is started by `sluice serve`")
            return value

        spec_path = Path(required("SLUICE_REPLICA_SPEC"))
        try:
            raw = json.loads(spec_path.read_text(encoding="utf-8"))
            api = DeployedApi(**{f.name: raw[f.name] for f in fields(DeployedApi)})
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"SLUICE_REPLICA_SPEC: cannot read a deployed API from {spec_path}: {e}") from e
        return cls(
            api=api,
            project_dir=Path(required("SLUICE_REPLICA_PROJECT")),
            state_dir=Path(required("SLUICE_REPLICA_STATE_DIR")),
            replica_id=env.get("SLUICE_REPLICA_ID", ""),
            api_url=env.get("SLUICE_API_URL", ""),
            sluice=Settings.from_env(env),
        )


Build = Callable[[ReplicaSettings, ApiConfig], RealtimePredictor]


def build_from_project(settings: ReplicaSettings, api: ApiConfig) -> RealtimePredictor:
    """Build the API's predictor from its project folder and make the API's namespace the process's.

    The process serves this one API for life, so its environment variables, `sys.path` and
    working directory are installed once rather than entered per request.
    """
    from predictors_runtime.builder import build_predictor

    built = build_predictor(
        settings.project_dir, api, {"config": dict(api.predictor.config)},
        model_cache_dir=Path(settings.sluice.cache_dir).expanduser() / "models" / api.name,
        poll_interval_s=settings.sluice.model_poll_interval_s,
    )
    try:
        built.namespace.install()
        labels = (api.name,)
        return RealtimePredictor(built.instance, built.client, batching=api.predictor.server_side_batching,
                                 predictor_type=api.predictor.type, close=built.close,
                                 threads=api.predictor.threads_per_process,
                                 on_batch=lambda size: process_figures.observe(REALTIME_BATCH_SIZE.name, labels, size))
    except BaseException:
        built.close()
        raise


def preload_models(client: Any, api: ApiConfig) -> int:
    """Load the latest version of the API's models before the process says it is ready.

    A replica is routed to once ready, so the first requests must not pay for downloads and
    loads. As many models as the memory cache holds are loaded (all when it is unbounded); a
    model with no version yet is skipped (live reloading serves it when one appears), while a
    model that fails to load fails the build, as a broken `__init__` does.
    """
    if client is None or api.predictor.models is None:
        return 0
    from foundation.errors import ModelNotFound

    manager = client.manager
    names = manager.names()
    limit = api.predictor.models.cache_size or len(names)
    loaded = 0
    for name in names[:limit]:
        try:
            manager.get(name, "latest")
        except ModelNotFound:
            continue
        loaded += 1
    return loaded


# uuid4 layout (version 4, RFC 4122 variant) over fast non-cryptographic random bits: request
# ids need to be unique, not secret, and `uuid.uuid4()` costs a system call per request.
_UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))
_UUID4_SET = (0x4 << 76) | (0x2 << 62)


def new_request_id() -> str:
    """A new request id: 32 hex digits laid out as a uuid4."""
    return "%032x" % (random.getrandbits(128) & _UUID4_CLEAR | _UUID4_SET)


def _error(status: int, kind: str, message: str, request_id: str) -> Response:
    response = json_response({"kind": kind, "message": message, "request_id": request_id}, status)
    response.headers[REQUEST_ID_HEADER] = request_id
    return response


class _Replica:
    """This process's predictor: building in the background, built, or failed to build."""

    def __init__(self, settings: ReplicaSettings, api: ApiConfig, build: Build) -> None:
        self.settings = settings
        self.api = api
        self.markers = ReadinessMarkers(settings.state_dir)
        self.predictor: RealtimePredictor | None = None
        self.failure = ""
        self._build = build
        self._thread = threading.Thread(target=self._run, name="sluice-build-predictor", daemon=True)

    def start(self) -> None:
        """Build in the background, or here and now when a sibling process already serves.

        A replica starting up answers 503 while it builds (never a hang). A process that gunicorn
        starts to replace a dead one joins a replica the proxy is already routing to: built
        before the app is handed to gunicorn, it accepts no connection until it can serve, and
        its siblings take the requests meanwhile.
        """
        if self.markers.ready_count() > 0:
            self._run()
        else:
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the build finished, either way (for tests and tools); True when it did."""
        if self._thread.ident is None:  # built in start(), on the caller's thread
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        with labelled(api=self.api.name, replica=self.settings.replica_id):
            try:
                predictor = self._build(self.settings, self.api)
                preload_models(predictor.client, self.api)
            except BaseException as e:  # noqa: BLE001 - whatever it was, the process keeps answering 503
                self.failure = e.message if isinstance(e, SluiceError) else error_text(e)
                log.error("building the predictor failed: %s", self.failure)
                try:
                    self.markers.mark_failed(self.failure)
                except OSError:
                    log.exception("could not write the failure marker")
                return
            self.predictor = predictor
            atexit.register(predictor.close)
            # What is built by now lives as long as the process: keep it out of the collector's full
            # passes (with TensorFlow loaded, one took about 390 ms and stalled every request waiting
            # in a server-side batch; bench/realtime.py's p99 went from 400-600 ms to about 100 ms).
            gc.collect()
            gc.freeze()
            try:
                self.markers.mark_ready()
            except OSError:
                log.exception("could not write the readiness marker: the launcher will not see this process ready")
                return
            log.info("predictor built; this process is ready")

    def not_ready_message(self) -> str:
        """What a caller is told: one line, no traceback and no path of this server (the whole
        failure is in the replica's record, `sluice get` and `sluice logs`, behind the API keys)."""
        if self.failure:
            return f"building the predictor failed: {one_line(self.failure)}"
        return "the predictor is still being built"

    def readiness(self, predictor: RealtimePredictor, request_id: str) -> Response:
        expected = self.api.predictor.processes_per_replica
        if expected > 1:
            ready = self.markers.ready_count()
            if ready < expected:
                message = f"{ready} of {expected} processes of this replica are ready"
                failure = self.markers.failure()
                if failure:
                    message += f"; a process failed to build the predictor: {one_line(failure)}"
                return _error(503, "not_ready", message, request_id)
        try:
            models = predictor.models()
        except SluiceError as e:
            return _error(e.http_status, e.kind, e.message, request_id)
        response = json_response(Readiness.model_validate({"ready": True, "models": models}).model_dump(mode="json"))
        response.headers[REQUEST_ID_HEADER] = request_id
        return response


def _leave_for_memory(guard: MemoryGuard, replica: _Replica, request_id: str) -> Response:
    """The answer of a request whose predictor grew past its API's compute.mem; the process leaves
    once it has answered what it holds (its server starts another, holding nothing), and its
    launcher is told why.

    The stop is asked before this answer goes out (gunicorn's workers finish the requests in hand):
    a worker that keeps connections then closes this one in the answer, so the proxy sends no other
    request on a connection about to close."""
    with contextlib.suppress(OSError):
        replica.markers.note_out_of_memory(guard.tripped)
    os.kill(os.getpid(), signal.SIGTERM)
    return _failure(guard.error(), request_id)


def _failure(e: Exception, request_id: str) -> Response:
    """The answer for an exception out of predict (or out of turning its result into a response)."""
    if isinstance(e, BatchFailed):  # logged once by the thread that ran the batch
        cause = e.cause
        if isinstance(cause, SluiceError) and cause.http_status < 500:
            return _error(cause.http_status, cause.kind, cause.message, request_id)
        return _error(500, "predictor_error", e.message, request_id)
    if isinstance(e, SluiceError):
        if e.http_status >= 500 and e.http_status != 504:
            log.error("%s: %s", e.kind, e.message, exc_info=e)
        return _error(e.http_status, e.kind, e.message, request_id)
    log.error("predict raised %s: %s", type(e).__name__, e, exc_info=e)
    return _error(500, "predictor_error", f"{type(e).__name__}: {e}", request_id)


def _request_id_of_failed_request(environ: dict[str, Any]) -> str:
    return environ.get(_REQUEST_ID_KEY) or environ.get("HTTP_X_REQUEST_ID") or new_request_id()


def create_replica_app(  # noqa: C901 - the app factory: each route is a closure over the one predictor
        settings: ReplicaSettings | None = None, build: Build | None = None, *, configure_logging: bool = True,
        recorder: Recorder | None = None, log_streams: LogStreams | None = None) -> Flask:
    """The WSGI app of one replica process; starts building the predictor in the background.

    `build(settings, api)` makes the predictor (default: `build_from_project`); tests inject
    their own. `configure_logging` makes the process log JSON lines at the API's log level, and
    append them to the API's log stream (in `log_streams`; by default the deployment's Redis).
    `recorder` counts the process's figures (by default into the deployment's Redis; a fast test
    hands in one on a `foundation.memory.MemoryFigureStore`).
    """
    settings = settings or ReplicaSettings.from_env()
    api = ApiConfig.from_dict(settings.api.spec)
    if configure_logging:
        configure_json_logging(api.predictor.log_level.upper())
        print_to_log()  # a predictor's print() is a line of its API's log, as on Cortex
        install_api_log_handler(settings.sluice, api.name, log_streams)  # `sluice logs API` shows its lines
    # Requests, rejections, batch sizes and model loads of this process, summed with every other's
    # in Redis by a background thread: the request path only adds in memory (foundation/figures.py).
    recorder = recorder or Recorder.for_url(settings.sluice.redis_address).start()
    process_figures.install(recorder)
    meter = RealtimeFigures(recorder, api.name)
    replica = _Replica(settings, api, build or build_from_project)
    guard = MemoryGuard.from_env() if configure_logging else None  # a replica its launcher put in a memory group
    app = Flask("sluice-replica")
    app.config["MAX_FORM_MEMORY_SIZE"] = None  # a form's text fields may be as large as the body
    app.extensions["sluice.replica"] = replica
    name = api.name

    def serve(request: Request) -> Response:
        """Answer one request and count it (one raising HTTPException is counted by its handler)."""
        started = time.perf_counter()
        request.environ[_STARTED_KEY] = started
        response = _serve(request)
        meter.answered(response.status_code, time.perf_counter() - started)
        return response

    def _counted(response: Response, environ: dict[str, Any]) -> Response:
        """An error handler's answer: counted when it answers a request of this API."""
        started = environ.get(_STARTED_KEY)
        if started is not None:
            meter.answered(response.status_code, time.perf_counter() - started)
        return response

    def _serve(request: Request) -> Response:
        environ = request.environ
        request_id = environ.get("HTTP_X_REQUEST_ID") or new_request_id()
        predictor = replica.predictor
        if predictor is None:
            return _error(503, "not_ready", replica.not_ready_message(), request_id)
        if request.method != "POST":
            return replica.readiness(predictor, request_id)
        deadline: float | None = None
        raw_deadline = environ.get("HTTP_X_SLUICE_DEADLINE_MS")
        if raw_deadline:
            try:
                deadline = int(raw_deadline) / 1000.0
            except ValueError:
                return _error(400, "bad_request", f"{DEADLINE_HEADER} must be epoch milliseconds", request_id)
            if time.time() >= deadline:
                return _error(504, "request_timeout", "the request's deadline passed before it could run",
                              request_id)
        args = RequestArgs(request_id=request_id, deadline=deadline)
        with labelled(api=name, request_id=request_id):
            try:
                if predictor.wants_payload:
                    args.payload = parse_payload(request)
                if predictor.wants_query_params:
                    args.query_params = dict(request.args.items(multi=True)) if environ.get("QUERY_STRING") else {}
                if predictor.wants_headers:
                    args.headers = request.headers
                if guard is None:
                    result = predictor.predict(args)
                else:
                    try:
                        with guard.predicting():
                            result = predictor.predict(args)
                    except GuardTripped:  # past its compute.mem: this request ends, and the process leaves
                        close_payload(args.payload)
                        return _leave_for_memory(guard, replica, request_id)
                response = to_response(result)
            except HTTPException:  # e.g. a form over the size limits: answered by the handler below
                close_payload(args.payload)
                environ[_REQUEST_ID_KEY] = request_id
                raise
            except Exception as e:  # noqa: BLE001 - the request's last-resort boundary: whatever the user's
                # code raised becomes this request's error answer, and the replica keeps serving
                close_payload(args.payload)
                return _failure(e, request_id)
        response.headers[REQUEST_ID_HEADER] = request_id
        if predictor.has_post_predict:
            response.call_on_close(lambda: _post_predict(predictor, result, args))
        elif type(args.payload) is FormPayload:  # its uploaded files stay open until the answer is sent
            response.call_on_close(args.payload.close)
        return response

    def _post_predict(predictor: RealtimePredictor, result: Any, args: RequestArgs) -> None:
        """Runs once the answer has been sent, on the request's thread; never reaches the client."""
        with labelled(api=name, request_id=args.request_id):
            try:
                predictor.post_predict(result, args)
            except Exception as e:
                log.error("post_predict raised %s: %s", type(e).__name__, e, exc_info=e)
            finally:
                close_payload(args.payload)

    def flask_serve() -> Response:
        return serve(request._get_current_object())  # type: ignore[attr-defined]  # the proxy's object

    for rule in (f"/{name}", f"/{name}/"):
        app.add_url_rule(rule, "serve", flask_serve, methods=["GET", "POST"], strict_slashes=False)

    @app.errorhandler(HTTPException)
    def _http_error(e: HTTPException) -> Response:
        return http_error(e, request.environ)

    def http_error(e: HTTPException, environ: dict[str, Any]) -> Response:
        request_id = _request_id_of_failed_request(environ)
        status = e.code or 500
        if status == 404:
            return _error(404, "api_not_found", f"this replica serves only /{name}", request_id)
        kinds = {400: "bad_request", 405: "method_not_allowed", 413: "payload_too_large"}
        return _counted(with_exception_headers(
            _error(status, kinds.get(status, e.name.lower().replace(" ", "_")), e.description or e.name,
                   request_id), e),
            environ)

    @app.errorhandler(Exception)
    def _unexpected(e: Exception) -> Response:
        return unexpected(e, request.environ)

    def unexpected(e: Exception, environ: dict[str, Any]) -> Response:
        request_id = _request_id_of_failed_request(environ)
        log.error("unexpected error", exc_info=e)
        return _counted(_error(500, "unexpected_error", f"{type(e).__name__}: {e}", request_id), environ)

    app.wsgi_app = _PredictionRoute(  # type: ignore[method-assign]  # the middleware pattern Flask documents
        app, (f"/{name}", f"/{name}/"), serve, http_error, unexpected)
    replica.start()
    return app


class _ReplicaRequest(Request):
    """The prediction route's request: as in the Flask app, a form field may be as large as the body."""

    max_form_memory_size = None


class _PredictionRoute:
    """`POST /<api>` served ahead of Flask's dispatch; every other request goes through the Flask app.

    The prediction route is a replica's whole hot path, and Flask's per-request machinery
    (request context, URL matching, hooks, response finalising) cost 100-170 us per request on
    the 2-core machine of bench/realtime.py, as much as a small model's run. Here the same
    handler gets a plain werkzeug request, answers the same errors, and the app context is still
    pushed, so a predictor answering with `flask.jsonify` works as it would in a Flask route.
    """

    def __init__(self, app: Flask, paths: tuple[str, ...], serve: Callable[[Request], Response],
                 http_error: Callable[[HTTPException, dict[str, Any]], Response],
                 unexpected: Callable[[Exception, dict[str, Any]], Response]) -> None:
        self._app = app
        self._flask = app.wsgi_app
        self._paths = frozenset(paths)
        self._serve, self._http_error, self._unexpected = serve, http_error, unexpected

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") not in self._paths:
            return self._flask(environ, start_response)
        with self._app.app_context():
            try:
                response = self._serve(_ReplicaRequest(environ))
            except HTTPException as e:
                response = self._http_error(e, environ)
            except Exception as e:  # noqa: BLE001 - the last boundary: a 500, as Flask's handler gives
                response = self._unexpected(e, environ)
        return response(environ, start_response)


__all__ = ["Build", "ReplicaSettings", "build_from_project", "create_replica_app", "new_request_id"]
