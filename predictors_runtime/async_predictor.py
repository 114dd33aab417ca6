"""One AsyncAPI predictor in one worker process, built once per API version and kept for its requests.

Cortex's contract: `PythonPredictor` / `ONNXPredictor` / `TensorFlowPredictor` with
`predict(self, payload, request_id)` (v0.32-0.33), or `Handler` with `handle_async(self, payload,
request_id)` (v0.34-0.35), each declaring only the arguments it uses; `__init__` is offered
`config` and the model client, as for realtime. Built by the builder batch and realtime share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foundation.errors import PredictorError

from .builder import BuiltPredictor, build_predictor
from .config import ApiConfig
from .loader import DeclaredCall

ARGUMENTS = ("payload", "request_id")


class AsyncPredictor:
    """The user's object, called the same way whatever it declares, inside its API version's namespace."""

    def __init__(self, built: BuiltPredictor) -> None:
        self.built = built
        predict = built.method("handle_async", "predict")
        if predict is None:
            raise PredictorError(f"{type(built.instance).__name__} has neither handle_async() nor predict()")
        self._predict = DeclaredCall(predict, ARGUMENTS)

    @classmethod
    def build(cls, project_dir: Path, api: ApiConfig, *, model_cache_dir: Path,
              poll_interval_s: float = 10.0) -> AsyncPredictor:
        """Build the API's predictor; `PredictorError` (with the user's traceback) when it cannot be."""
        built = build_predictor(project_dir, api, {"config": dict(api.predictor.config)},
                                model_cache_dir=model_cache_dir, poll_interval_s=poll_interval_s)
        try:
            return cls(built)
        except BaseException:
            built.close()
            raise

    def predict(self, payload: Any, request_id: str | list[str]) -> Any:
        """Run one request (or, with `server_side_batching`, lists of payloads and ids); the user's
        exceptions propagate unchanged for the caller to record."""
        with self.built.namespace.active():
            return self._predict({"payload": payload, "request_id": request_id})

    def close(self) -> None:
        self.built.close()
