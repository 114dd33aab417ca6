"""One realtime predictor in one replica process: the user's object, called as Cortex called it.

`predict(self, payload, query_params, headers)` (or `handle_post`) receives only the arguments
it declares; `post_predict(self, response, payload, query_params, headers)` is optional and
runs after the answer has been sent. What each method declares is worked out once here, so a
request pays for no signature inspection, and the request is parsed only as far as the
methods need (no body parsing when neither declares `payload`).

With `server_side_batching`, what the predictor sees depends on its type, as on Cortex:
- python (and onnx, an extension of Sluice's: Cortex offered no batching for ONNX): `predict`
  receives lists (payloads, query_params and headers aligned by index) and must return a list
  with one result per request (see `batching.py`);
- tensorflow: `predict` is called per request with one payload, unchanged, and the concurrent
  `tensorflow_client.predict` calls are gathered below it into shared runs of the model (on
  Cortex, TF Serving did that; see `clients/tensorflow_batching.py`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from foundation.errors import PredictorError, RequestTimeout

from .batching import DEFAULT_MAX_WAIT_S, Batcher, request_deadline
from .config import ServerSideBatching
from .loader import DeclaredCall

if TYPE_CHECKING:
    from werkzeug.datastructures import Headers

PREDICT_ARGUMENTS = ("payload", "query_params", "headers")
POST_PREDICT_ARGUMENTS = ("response", "payload", "query_params", "headers")
# Predictor types whose server_side_batching gathers the model client's calls below an unchanged,
# one-payload `predict` (Cortex's TensorFlowPredictor, batched by TF Serving); others get lists.
CLIENT_BATCHING_TYPES = frozenset({"tensorflow"})


@dataclass(slots=True)
class RequestArgs:
    """What one request offers the predictor; an argument no method declares stays None."""

    payload: Any = None
    query_params: dict[str, str] | None = None
    headers: Mapping[str, str] | Headers | None = None  # werkzeug's, in a replica
    request_id: str = ""
    deadline: float | None = None  # epoch seconds by which the answer is due


def _request_id(args: RequestArgs) -> str:
    return args.request_id


class RealtimePredictor:
    """The user's predictor object (and its model client), wrapped for serving requests.

    `close` is called by `close()`: the builder's clean-up (stop live reloading) when built by it.
    """

    def __init__(self, instance: Any, client: Any = None, *, batching: ServerSideBatching | None = None,
                 predictor_type: str = "python", max_wait_s: float = DEFAULT_MAX_WAIT_S,
                 close: Callable[[], None] | None = None, threads: int = 1,
                 on_batch: Callable[[int], None] | None = None) -> None:
        """`on_batch(size)` is told the size of each server-side batch (for the replica's figures):
        requests per `predict` call, or for a tensorflow predictor calls per run of the model."""
        self.instance = instance
        self._threads = threads
        self._deadline_pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.client = client
        self._close = close
        predict = getattr(instance, "handle_post", None) or getattr(instance, "predict", None)
        if not callable(predict):
            raise PredictorError(f"{type(instance).__name__} has neither handle_post() nor predict()")
        self._predict = DeclaredCall(predict, PREDICT_ARGUMENTS)
        post_predict = getattr(instance, "post_predict", None)
        self._post_predict = DeclaredCall(post_predict, POST_PREDICT_ARGUMENTS) if callable(post_predict) else None
        declared = set(self._predict.names) | set(self._post_predict.names if self._post_predict else ())
        self.wants_payload = "payload" in declared
        self.wants_query_params = "query_params" in declared
        self.wants_headers = "headers" in declared
        self._batcher: Batcher[RequestArgs] | None = None
        self.gathers_client_calls = False
        if batching is not None and predictor_type in CLIENT_BATCHING_TYPES:
            gather = getattr(client, "gather", None)
            if not callable(gather):
                raise PredictorError(f"a {predictor_type} predictor with server_side_batching needs its model client "
                                     "(predictor.models)")
            gather(batching.max_batch_size, batching.batch_interval, max_wait_s=max_wait_s, on_run=on_batch)
            self.gathers_client_calls = True
        elif batching is not None:
            self._batcher = Batcher(self._run_batch, batching.max_batch_size, batching.batch_interval,
                                    max_wait_s=max_wait_s, label=_request_id, on_batch=on_batch)

    @property
    def has_post_predict(self) -> bool:
        return self._post_predict is not None

    @property
    def batched(self) -> bool:
        """`predict` receives lists of requests (server-side batching of a python or onnx predictor)."""
        return self._batcher is not None

    def predict(self, args: RequestArgs) -> Any:
        """This request's result: `predict` called for it alone, or its element of a batch.

        (A tensorflow predictor's `predict` is called for its request alone even when batching:
        its client's calls are what is gathered.) The user's exceptions propagate unchanged when
        `predict` is called per request; a failed batch of requests raises
        `batching.BatchFailed` (its `cause` is the user's exception) in every one of its requests.
        """
        if self._batcher is not None:
            return self._batcher.submit(args, args.deadline)
        call = {"payload": args.payload, "query_params": args.query_params, "headers": args.headers}
        if self.gathers_client_calls:
            return self._predict_gathered(args.deadline, call)
        if args.deadline is None:
            return self._predict(call)
        return self._predict_by(args.deadline, call)

    def _predict_gathered(self, deadline: float | None, call: dict[str, Any]) -> Any:
        """One request's `predict`, whose client calls wait in the client's windows no longer than its deadline."""
        token = request_deadline.set(deadline)
        try:
            if deadline is None:
                return self._predict(call)
            return self._predict_by(deadline, call)  # the pool's thread runs in a copy of this context
        finally:
            request_deadline.reset(token)

    def _predict_by(self, deadline: float, call: dict[str, Any]) -> Any:
        """Run predict, but answer `RequestTimeout` at the deadline if it has not returned by then.

        The proxy bounds the queue wait and the run separately; only here is the request's
        whole time (`request_timeout`) known, so the run gets what the wait left of it. Python
        cannot stop a thread: a predict still running at the deadline finishes in the background
        on this pool (one thread per request thread), and its result is dropped.
        """
        pool = self._deadline_pool
        if pool is None:
            with self._pool_lock:
                if self._deadline_pool is None:
                    self._deadline_pool = ThreadPoolExecutor(self._threads, thread_name_prefix="sluice-predict")
                pool = self._deadline_pool
        future = pool.submit(contextvars.copy_context().run, self._predict, call)  # keeps the log labels
        try:
            return future.result(timeout=max(deadline - time.time(), 0.0))
        except FutureTimeout:
            future.cancel()  # not started yet (the pool is busy with late predicts): never starts
            raise RequestTimeout("predict did not return within the API's request_timeout") from None

    def _run_batch(self, batch: list[RequestArgs]) -> Any:
        return self._predict({
            "payload": [a.payload for a in batch],
            "query_params": [a.query_params for a in batch],
            "headers": [a.headers for a in batch],
        })

    def post_predict(self, response: Any, args: RequestArgs) -> None:
        """Run `post_predict` for one request (its own result and arguments, even when batched)."""
        if self._post_predict is not None:
            self._post_predict({"response": response, "payload": args.payload,
                                "query_params": args.query_params, "headers": args.headers})

    def models(self) -> list[dict[str, Any]]:
        """`[{"name", "versions"}]` of the models the client serves; empty without a model client."""
        manager = getattr(self.client, "manager", None) if self.client is not None else None
        if manager is None:
            return []
        return [{"name": name, "versions": manager.versions(name)} for name in manager.names()]

    def close(self) -> None:
        if self._deadline_pool is not None:
            self._deadline_pool.shutdown(wait=False, cancel_futures=True)
        if self._close is not None:
            self._close()
