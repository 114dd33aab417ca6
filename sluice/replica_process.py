"""How one realtime replica's gunicorn is started: its command, its environment, its process.

A replica is `gunicorn 'api.realtime:create_replica_app()'` in the API's project folder. It gets
no `--preload` (each process builds its own predictor after the fork, so CUDA and threads are
its own), sync workers unless the API wants several requests per process at once (gthread)
or gathers them into batches (gevent), and a process group of its own, tied to the launcher's
life, so that nothing outlives the launcher.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from foundation.api_registry import DeployedApi
from foundation.processes import die_with_parent
from predictors_runtime.config import ApiConfig, PredictorConfig
from predictors_runtime.project import read_dotenv

from .tls.hosts import HostTls

ROOT = Path(__file__).resolve().parent.parent
REPLICA_APP = "api.realtime:create_replica_app()"
MIN_GRACEFUL_S = 30.0
# A replica keeps the proxy's connections open this long between requests: longer than the proxy
# keeps an idle one (haproxy closes its idle server connections first, so it never sends a request
# on a connection the replica is closing).
KEEP_ALIVE_S = 120
# One request at a time per process, connections kept alive (gunicorn's sync worker closes each).
KEEP_ALIVE_WORKER = "sluice.keepalive_worker.KeepAliveSyncWorker"
# gunicorn's --timeout kills a *sync* worker that has not reported for this long, and a sync
# worker cannot report while it runs predict: make it long enough never to hit a real request.
MIN_WORKER_TIMEOUT_S = 3600


def worker_class_argv(predictor: PredictorConfig) -> list[str]:
    """One request at a time: gunicorn's sync worker, keeping connections alive for `KEEP_ALIVE_S`
    (`sluice/keepalive_worker.py`; see `keeps_connections`); gthread for several; gevent for
    server-side batching.

    With batching, every request of a batch waits for it, so a process holds up to
    `threads_per_process` waiting requests. As gthread threads, each wait, wake-up and GIL
    hand-off cost more CPU than the batch saves on a small model (bench/realtime.py measured
    batching at 0.96x of no batching on its 1.1M-parameter MLP with gthread). As greenlets of
    gunicorn's gevent worker they cost little, the batch runs on the event loop's own thread,
    and the proxy's connections are kept alive: 1.4-1.7x on the same MLP. The worker's
    connection limit is twice `threads_per_process`, so that idle kept-alive connections never
    take the places of waiting requests; the proxy's `max_concurrency` bounds the requests.
    """
    if predictor.server_side_batching is not None:
        return ["--worker-class", "gevent", "--worker-connections", str(2 * predictor.threads_per_process),
                "--keep-alive", str(KEEP_ALIVE_S)]
    if predictor.threads_per_process > 1:
        return ["--worker-class", "gthread", "--threads", str(predictor.threads_per_process)]
    return ["--worker-class", KEEP_ALIVE_WORKER, "--keep-alive", str(KEEP_ALIVE_S)]


def keeps_connections(predictor: PredictorConfig) -> bool:
    """Whether the replica's processes serve any connection the proxy keeps, one request at a time
    (`KEEP_ALIVE_WORKER`), so that the proxy may send any request on any idle connection.

    Not gthread's or gevent's: a process of theirs takes every connection it is offered while it
    runs requests, so the proxy's idle connections could all be one process's, and the others
    would get no request while it queued them (a process gunicorn starts again after one died would
    never get one). gRPC replicas carry their calls on HTTP/2 streams of their own."""
    return predictor.protobuf_path is None and KEEP_ALIVE_WORKER in worker_class_argv(predictor)


def graceful_timeout_s(predictor: PredictorConfig) -> float:
    """How long a stopping gunicorn waits for its requests: the API's request timeout, at least 30 s."""
    return max(MIN_GRACEFUL_S, float(predictor.request_timeout or 0))


def no_control_socket() -> list[str]:
    """gunicorn >= 25 opens a control socket at one path per user; many gunicorns would share it."""
    from gunicorn.config import KNOWN_SETTINGS

    return ["--no-control-socket"] if any(s.name == "control_socket_disable" for s in KNOWN_SETTINGS) else []


def gunicorn_argv(predictor: PredictorConfig, bind: str, python: str = sys.executable,
                  unix_socket: str | None = None, tls: HostTls | None = None) -> list[str]:
    """The gunicorn command of one replica. No --preload: each process builds its own predictor.

    `unix_socket`: a path it listens on besides `bind`, for a proxy on the same host
    (sluice/local_socket.py). `tls`: it serves TLS only, with this host's certificate.
    """
    argv = [python, "-m", "gunicorn", "-b", bind, "-w", str(predictor.processes_per_replica)]
    if unix_socket:
        argv += ["-b", f"unix:{unix_socket}"]
    if tls is not None:
        argv += tls.gunicorn_argv()
    argv += worker_class_argv(predictor)
    worker_timeout = max(MIN_WORKER_TIMEOUT_S, int(predictor.request_timeout or 0) * 2)
    argv += [
        "--graceful-timeout", str(int(graceful_timeout_s(predictor))),
        "--timeout", str(worker_timeout),
        # Sluice's own packages found before anything else on the path; gunicorn runs in the
        # replica's state folder, and the project's folder comes first only inside its namespace.
        "--pythonpath", str(ROOT),
        *no_control_socket(),
        REPLICA_APP,
    ]
    return argv


def replica_argv(predictor: PredictorConfig, bind: str, python: str = sys.executable,
                 unix_socket: str | None = None, tls: HostTls | None = None) -> list[str]:
    """The command of one replica: gunicorn serving HTTP (over TLS with `tls`), or for a gRPC API
    (`protobuf_path`) the gRPC replica (sluice/grpc_replica.py) on the same addresses."""
    if predictor.protobuf_path is None:
        return gunicorn_argv(predictor, bind, python, unix_socket, tls)
    return [python, "-m", "sluice.grpc_replica", bind, *(["--unix", unix_socket] if unix_socket else []),
            *(["--tls-cert", tls.cert, "--tls-key", tls.key] if tls is not None else [])]


def replica_env(
    base: Mapping[str, str], project_dir: Path, api: DeployedApi, *, spec_path: Path, markers_dir: Path,
    replica_id: str, api_url: str,
) -> dict[str, str]:
    """The replica's environment: the launcher's, then the project's `.env`, then `predictor.env`,
    then the variables the replica app reads (which neither file may override)."""
    env = dict(base)
    env.update(read_dotenv(project_dir))
    env.update({k: str(v) for k, v in ApiConfig.from_dict(api.spec).predictor.env.items()})
    env.update({
        "SLUICE_REPLICA_SPEC": str(spec_path),
        "SLUICE_REPLICA_PROJECT": str(project_dir),
        "SLUICE_REPLICA_STATE_DIR": str(markers_dir),
        "SLUICE_REPLICA_ID": replica_id,
        "SLUICE_API_URL": api_url.rstrip("/"),
        "PYTHONUNBUFFERED": "1",
    })
    env["PYTHONPATH"] = os.pathsep.join(
        dict.fromkeys(p for p in [str(ROOT), *env.get("PYTHONPATH", "").split(os.pathsep)] if p)
    )
    return env


def spawn_gunicorn(argv: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """gunicorn in its own process group (so the group can be killed as one), tied to our life."""
    return subprocess.Popen(
        argv, env=dict(env), cwd=cwd, start_new_session=True, preexec_fn=die_with_parent(os.getpid()),
    )


def signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    """Signal gunicorn and its workers at once (a worker left by a dead arbiter keeps the port)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
