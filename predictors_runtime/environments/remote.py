"""A predictor that runs in its API's environment, in a child process of the worker node.

A worker node is one Celery process in Sluice's own environment, placed on jobs of any API; an
API with requirements of its own runs its predictor in a process started with its environment's
interpreter (`child.py`), one per job (or AsyncAPI version) on the node, which lives as long as
the node keeps the predictor. The node keeps everything else (the message, the time limit, the
records, the outputs), so a node placed per job, `workers`, time limits and giving a batch back
when a node dies hold unchanged. The child dies with the node (SIGKILL on the parent's death), a
child that dies alone fails the call it was running (the batch is retried as any failed try) and
is started again on the next call.

Calls and answers travel pickled over a socket pair; the predictor's log records come back on
the same connection and are emitted here, inside the capture of the batch or request that runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from foundation.errors import EnvironmentBuildFailed, PredictorError
from foundation.processes import die_with_parent

from ..config import ApiConfig
from .host import HostEnvironments
from .spec import EnvironmentSpec

log = logging.getLogger(__name__)

CHILD_MODULE = "predictors_runtime.environments.child"
CLOSE_TIMEOUT_S = 10.0


class RemoteCallError(PredictorError):
    """The user's code raised in the environment's process; `remote_text` is its traceback there."""

    def __init__(self, type_name: str, message: str, remote_text: str) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_text = remote_text or message


class RemotePredictor:
    """`predict`, `on_job_complete` and `close` of a predictor built in another interpreter."""

    def __init__(self, python: Path, recipe: dict[str, Any], *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, on_close: Callable[[], None] | None = None) -> None:
        """Start the process and build the predictor there; `PredictorError` when it cannot be built."""
        self._python = python
        self._recipe = recipe
        self._env = dict(os.environ if env is None else env)
        self._cwd = cwd
        self._on_close = on_close
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        try:
            self._start()
        except BaseException:
            self._stop()
            if on_close is not None:
                on_close()
            raise

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            try:
                self._process = subprocess.Popen(
                    [str(self._python), "-m", CHILD_MODULE, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                    env=self._env, cwd=self._cwd, preexec_fn=die_with_parent(os.getpid(), signal.SIGKILL))
            except OSError as e:
                raise PredictorError(f"the environment's interpreter {self._python} could not be started: {e}") from e
            self._connection = Connection(os.dup(ours.fileno()))
        self._ask(("build", self._recipe))

    def _stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            self._process.wait()
            self._process = None

    def _ask(self, request: tuple[Any, ...]) -> Any:
        connection = self._connection
        if connection is None:
            self._start()
            connection = self._connection
            assert connection is not None
        try:
            connection.send(request)
            while True:
                answer = connection.recv()
                if answer[0] == "log":
                    record = logging.makeLogRecord(answer[1])
                    logging.getLogger(record.name).handle(record)
                    continue
                break
        except (EOFError, OSError) as e:
            code = self._process.poll() if self._process is not None else None
            if code is None and self._process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self._process.wait(timeout=1.0)
            self._stop()
            how = f"exited with status {code}" if code is not None and code >= 0 else (
                f"was killed by signal {-code}" if code is not None else "stopped answering")
            raise PredictorError(f"the predictor's process (in the api's environment) {how}; it is started "
                                 "again for the next try") from e
        if answer[0] == "ok":
            return answer[1]
        _, type_name, message, remote_text = answer
        raise RemoteCallError(type_name, message, remote_text)

    def predict(self, *args: Any) -> Any:
        return self._ask(("call", "predict", args))

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        self._ask(("call", "on_job_complete", (job_status,)))

    def close(self) -> None:
        """Close the predictor there and end the process (killed if it does not end in time)."""
        try:
            if self._connection is not None and self._process is not None and self._process.poll() is None:
                self._connection.send(("close",))
                if self._connection.poll(CLOSE_TIMEOUT_S):
                    with contextlib.suppress(EOFError, OSError):
                        while self._connection.recv()[0] == "log":
                            pass
        except OSError:
            pass
        finally:
            self._stop()
            if self._on_close is not None:
                self._on_close()
                self._on_close = None


def start_in_environment(environments: HostEnvironments, environment: dict[str, Any], project_dir: Path,
                         api: ApiConfig, recipe: dict[str, Any]) -> RemotePredictor:
    """Build (or find) the API's environment on this host, then its predictor in a process there.

    `PredictorError` when the environment cannot be built (the installer's message) or the
    predictor cannot be built in it (the user's traceback there).
    """
    spec = EnvironmentSpec.from_dict(environment)
    try:
        built = environments.ensure_for(spec, project_dir, api)
    except EnvironmentBuildFailed as e:
        raise PredictorError(f"building the api's environment {spec.key} failed: {e.message}") from e
    held = environments.hold(spec.key)
    recipe = {**recipe, "api": api.to_dict(), "project_dir": str(project_dir)}
    return RemotePredictor(built.python, recipe, cwd=project_dir, on_close=lambda: os.close(held))
