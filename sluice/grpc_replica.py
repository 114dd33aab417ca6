"""One gRPC realtime replica process: the project's own service, as Cortex v0.32-v0.35 served an API
whose `predictor.protobuf_path` names a `.proto` file.

    python -m sluice.grpc_replica HOST:PORT [--unix PATH] [--tls-cert FILE --tls-key FILE]

It is told what to serve as an HTTP replica is (the `SLUICE_REPLICA_*` variables, `ReplicaSettings`).
At start it compiles the project's `.proto` with grpcio-tools into its state folder, imports the
two generated modules (`<stem>_pb2`, `<stem>_pb2_grpc`: importable by those names, as on Cortex,
so the predictor may import them too) and builds the predictor with them offered to `__init__`
as `proto_module_pb2` and `module_proto_pb2` (Cortex's example and Cortex's documentation spelled
it each way), beside `config` and the model client.

The `.proto` holds one service (Cortex's rule); each of its RPCs calls the predictor's method of
the same name with what it declares of `payload` (the request message) and `context` (gRPC's).
A method of a server-streaming RPC yields its messages. What the method raises ends the call with
`INTERNAL` and the exception's type and message (logged with its traceback); until the predictor
is built, or when it failed to build, every call ends `UNAVAILABLE` saying why, as an HTTP
replica answers 503. The readiness markers are an HTTP replica's, so the launcher and the proxy
judge both alike. The server runs `threads_per_process` calls at once; SIGTERM stops it, letting
calls in progress finish within the graceful time.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

from api.realtime import ReplicaSettings, new_request_id, preload_models
from foundation import figure_sink as process_figures
from foundation.errors import ConfigError, SluiceError
from foundation.figures import RealtimeFigures, Recorder
from foundation.json_logs import configure_json_logging, labelled
from foundation.log_streams import install_api_log_handler
from foundation.printed_lines import print_to_log
from foundation.replica_directory import ReadinessMarkers
from predictors_runtime.config import ApiConfig
from predictors_runtime.extras import needs_extra
from predictors_runtime.grpc_proto import Service, compile_proto, service_of
from predictors_runtime.loader import call_with_declared, error_text, one_line

log = logging.getLogger("sluice.grpc_replica")

# The names Cortex offered the generated messages module under.
PROTO_MODULE_ARGUMENTS = ("proto_module_pb2", "module_proto_pb2")
GENERATED_FOLDER = "grpc-generated"
REQUEST_ID_METADATA = "x-request-id"
# How long a stopping replica waits to send its last figures.
LAST_FIGURES_S = 5.0


class PredictorSlot:
    """This process's predictor: building in the background, built, or failed to build."""

    def __init__(self) -> None:
        self.instance: Any = None
        self.failure = ""

    def not_ready(self) -> str:
        if self.failure:
            return f"building the predictor failed: {one_line(self.failure)}"
        return "the predictor is still being built"


def servicer_for(service: Service, predictor: PredictorSlot, api_name: str, meter: RealtimeFigures | None) -> Any:
    """An instance of the generated servicer whose every RPC calls the predictor's method of that name."""
    import grpc

    def rpc(method_name: str) -> Callable[[Any, Any, Any], Any]:
        def call(self: Any, request: Any, context: Any) -> Any:
            started = time.perf_counter()
            metadata = dict(context.invocation_metadata() or ())
            request_id = str(metadata.get(REQUEST_ID_METADATA) or new_request_id())
            context.set_trailing_metadata(((REQUEST_ID_METADATA, request_id),))
            instance = predictor.instance
            if instance is None:
                _count(meter, 503, started)
                context.abort(grpc.StatusCode.UNAVAILABLE, predictor.not_ready())
            method: Callable[..., Any] | None = getattr(instance, method_name, None)
            if method is None or not callable(method):
                _count(meter, 501, started)
                context.abort(grpc.StatusCode.UNIMPLEMENTED,
                              f"{type(instance).__name__} has no method {method_name} for the rpc of that name")
                raise AssertionError("context.abort raises")
            with labelled(api=api_name, request_id=request_id):
                try:
                    result = call_with_declared(method, {"payload": request, "context": context})
                except Exception as e:  # noqa: BLE001 - the call's last boundary: the replica keeps serving
                    _raised(context, meter, e, started)
            if inspect.isgenerator(result):
                return _streamed(result, context, meter, started, api_name, request_id)
            _count(meter, 200, started)
            return result
        call.__name__ = method_name
        return call

    handler_class = type(f"{service.servicer.__name__}ForPredictor", (service.servicer,),
                         {name: rpc(name) for name in service.methods})
    return handler_class()


class _Unavailable:
    """Every call of a replica whose .proto cannot be served ends UNAVAILABLE, saying why."""

    def __init__(self, predictor: PredictorSlot) -> None:
        self._predictor = predictor

    def service(self, handler_call_details: Any) -> Any:
        import grpc

        def refuse(request: Any, context: Any) -> Any:
            context.abort(grpc.StatusCode.UNAVAILABLE, self._predictor.not_ready())

        return grpc.unary_unary_rpc_method_handler(refuse)


def _streamed(results: Iterator[Any], context: Any, meter: RealtimeFigures | None, started: float,
              api_name: str, request_id: str) -> Iterator[Any]:
    """A server-streaming method's messages; what it raises midway ends the call as a raise does."""
    with labelled(api=api_name, request_id=request_id):
        try:
            yield from results
        except Exception as e:  # noqa: BLE001 - as in a unary call
            _raised(context, meter, e, started)
    _count(meter, 200, started)


def _raised(context: Any, meter: RealtimeFigures | None, e: Exception, started: float) -> None:
    import grpc

    log.error("predictor raised %s: %s", type(e).__name__, e, exc_info=e)
    _count(meter, 500, started)
    context.abort(grpc.StatusCode.INTERNAL, f"predictor_error: {type(e).__name__}: {e}")


def _count(meter: RealtimeFigures | None, code: int, started: float) -> None:
    if meter is not None:
        meter.answered(code, time.perf_counter() - started)


def build(settings: ReplicaSettings, api: ApiConfig, messages: ModuleType, predictor: PredictorSlot,
          markers: ReadinessMarkers) -> None:
    """Build the predictor with the messages module offered to `__init__`; mark this process ready,
    or failed with the reason."""
    from predictors_runtime.builder import build_predictor

    with labelled(api=api.name, replica=settings.replica_id):
        try:
            init_args: dict[str, Any] = {"config": dict(api.predictor.config)}
            init_args.update(dict.fromkeys(PROTO_MODULE_ARGUMENTS, messages))
            built = build_predictor(
                settings.project_dir, api, init_args,
                model_cache_dir=Path(settings.sluice.cache_dir).expanduser() / "models" / api.name,
                poll_interval_s=settings.sluice.model_poll_interval_s)
            built.namespace.install()
            preload_models(built.client, api)
        except BaseException as e:  # noqa: BLE001 - whatever it was, the process keeps answering UNAVAILABLE
            predictor.failure = e.message if isinstance(e, SluiceError) else error_text(e)
            log.error("building the predictor failed: %s", predictor.failure)
            markers.mark_failed(predictor.failure)
            return
        predictor.instance = built.instance
        markers.mark_ready()
        log.info("predictor built; this process is ready")


def serve(bind: str, unix_socket: str | None = None, settings: ReplicaSettings | None = None,
          stop: threading.Event | None = None, tls: tuple[Path, Path] | None = None) -> int:
    """Serve until SIGTERM (or `stop`); the exit status. `tls`: (certificate, key) of this host: it
    serves TLS only (sluice/tls/hosts.py)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():  # from the start: a stop asked early is kept
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    settings = settings or ReplicaSettings.from_env()
    api = ApiConfig.from_dict(settings.api.spec)
    configure_json_logging(api.predictor.log_level.upper())
    print_to_log()
    install_api_log_handler(settings.sluice, api.name, None)
    recorder = Recorder.for_url(settings.sluice.redis_address).start()
    process_figures.install(recorder)
    meter = RealtimeFigures(recorder, api.name)
    markers = ReadinessMarkers(settings.state_dir)
    protobuf_path = api.predictor.protobuf_path
    if not protobuf_path:
        raise ConfigError(f"api {api.name} has no predictor.protobuf_path: it is served over HTTP")
    with needs_extra("grpc", "gRPC realtime APIs"):
        import grpc

    predictor = PredictorSlot()
    threads = api.predictor.threads_per_process
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sluice-rpc"),
                         maximum_concurrent_rpcs=threads + (api.predictor.max_queue_length or 0) or None,
                         options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
    service: Service | None = None
    try:
        messages, stubs = compile_proto(settings.project_dir, protobuf_path, settings.state_dir / GENERATED_FOLDER)
        service = service_of(messages, stubs, protobuf_path)
    except SluiceError as e:
        # As an HTTP replica whose predictor failed to build: it stays, and every call is told why.
        predictor.failure = e.message
        server.add_generic_rpc_handlers((_Unavailable(predictor),))
    else:
        service.add_to_server(servicer_for(service, predictor, api.name, meter), server)
    # Listening before anything is marked, ready or failed: whoever reads a marker can call at once.
    credentials = (grpc.ssl_server_credentials([(tls[1].read_bytes(), tls[0].read_bytes())])
                   if tls is not None else None)
    for address in (bind, *([f"unix:{unix_socket}"] if unix_socket else [])):
        port = (server.add_secure_port(address, credentials) if credentials is not None
                else server.add_insecure_port(address))
        if port == 0:  # gRPC says 0 for an address it cannot listen on
            raise ConfigError(f"the gRPC replica cannot listen on {address}")
    server.start()
    if service is None:
        log.error("%s", predictor.failure)
        markers.mark_failed(predictor.failure)
    else:
        log.info("serving %s over gRPC on %s", service.full_name, bind)
        threading.Thread(target=build, args=(settings, api, service.messages, predictor, markers),
                         name="sluice-build-predictor", daemon=True).start()
    stop.wait()
    grace = max(30.0, float(api.predictor.request_timeout or 0))
    server.stop(grace).wait()
    # The last figures are sent if Redis answers soon; a stalled Redis must not hold the exit.
    last = threading.Thread(target=recorder.close, name="sluice-last-figures", daemon=True)
    last.start()
    last.join(LAST_FIGURES_S)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.grpc_replica", description=__doc__.split("\n")[0])
    parser.add_argument("bind", help="HOST:PORT to serve on")
    parser.add_argument("--unix", help="a Unix socket to serve on as well (for a proxy on this host)")
    parser.add_argument("--tls-cert", type=Path, help="this host's certificate: serve TLS only (with --tls-key)")
    parser.add_argument("--tls-key", type=Path, help="the key of --tls-cert")
    args = parser.parse_args(argv)
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    tls = (args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    return serve(args.bind, args.unix, tls=tls)


if __name__ == "__main__":
    sys.exit(main())
