"""The process that runs one predictor in its API's environment: `<env>/bin/python -m
predictors_runtime.environments.child <fd>`, started by `remote.RemotePredictor`.

It reads requests from the connection on file descriptor `fd` and answers each: `("build",
recipe)` builds the predictor, `("call", method, args)` calls it, `("close",)` closes it and ends
the process. Log records go back on the same connection as `("log", fields)` before the answer,
so the worker node emits them inside the batch's or request's log capture. The process runs one
API alone, so its namespace is installed for good (`ApiNamespace.install`): no swap per call.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from foundation.errors import PredictorError, SluiceError
from foundation.printed_lines import print_to_log

from ..loader import error_text

# Fields of a log record that travel as they are; the rest must be plain data to travel at all.
_PLAIN = (str, int, float, bool, type(None))


class _Channel:
    """The connection to the worker node; sends from any thread, one at a time."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self.connection.send(message)


class _Forward(logging.Handler):
    """Sends every record to the node, formatted here (arguments and exceptions may not pickle)."""

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self._channel = channel

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fields = {k: v for k, v in record.__dict__.items() if isinstance(v, _PLAIN)}
            fields["msg"] = record.getMessage()
            fields["args"] = None
            if record.exc_info:
                fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
            fields.pop("exc_info", None)
            self._channel.send(("log", fields))
        except Exception:  # noqa: BLE001 - a record that cannot travel is dropped, as logging drops its errors
            self.handleError(record)


def _build(recipe: dict[str, Any]) -> Any:
    from ..config import ApiConfig

    kind = recipe["kind"]
    api = ApiConfig.from_dict(recipe["api"])
    folder = Path(recipe["project_dir"])
    cache = Path(recipe["model_cache_dir"])
    if kind == "batch":
        from ..batch_predictor import BatchPredictor

        predictor: Any = BatchPredictor.build(folder, api, recipe["job_spec"], recipe["job_config"],
                                              model_cache_dir=cache, poll_interval_s=recipe["poll_interval_s"])
    elif kind == "task":
        from ..task_predictor import TaskPredictor

        predictor = TaskPredictor.build(folder, api, recipe["job_spec"], recipe["job_config"], model_cache_dir=cache)
    elif kind == "async":
        from ..async_predictor import AsyncPredictor

        predictor = AsyncPredictor.build(folder, api, model_cache_dir=cache, poll_interval_s=recipe["poll_interval_s"])
    else:
        raise PredictorError(f"unknown predictor kind {kind!r}")
    namespace = getattr(getattr(predictor, "built", None), "namespace", None)
    if namespace is not None:
        namespace.install()  # this process serves this one API: no swap around every call
    return predictor


def _failure(e: BaseException) -> tuple[str, str, str]:
    message = e.message if isinstance(e, SluiceError) else f"{type(e).__name__}: {e}"
    return type(e).__name__, message, error_text(e)


def serve(connection: Connection) -> int:
    """Answer the node's requests until it closes the predictor or the connection."""
    channel = _Channel(connection)
    root = logging.getLogger()
    root.handlers[:] = [_Forward(channel)]
    root.setLevel(logging.INFO)
    print_to_log()  # printed lines travel to the node as its logged ones do
    predictor: Any = None
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return 0
        op = request[0]
        try:
            if op == "build":
                predictor = _build(request[1])
                answer: tuple[Any, ...] = ("ok", None)
            elif op == "call":
                if predictor is None:
                    raise PredictorError("the predictor was not built")
                answer = ("ok", getattr(predictor, request[1])(*request[2]))
            elif op == "close":
                if predictor is not None:
                    predictor.close()
                channel.send(("ok", None))
                return 0
            else:
                raise PredictorError(f"unknown request {op!r}")
        except BaseException as e:  # noqa: BLE001 - every failure of the user's code goes back to the node
            answer = ("error", *_failure(e))
        try:
            channel.send(answer)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            channel.send(("error", "PredictorError",
                          f"the predictor's result cannot be sent back to the worker node: {type(e).__name__}: {e}",
                          ""))


def main(argv: list[str]) -> int:
    fd = int(argv[1])
    os.set_inheritable(fd, False)
    return serve(Connection(fd))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
