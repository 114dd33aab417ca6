"""One instance of a user's batch predictor, built for one job and reused for all its batches.

A worker process runs many jobs of many APIs, so every call into the user's code happens
inside the API version's namespace (`namespace.py`): it sees its own `.env`, import path and
modules, with the project folder as working directory, and nothing of any other job's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foundation.errors import PredictorError

from .builder import BuiltPredictor, build_predictor
from .config import ApiConfig, merge_config
from .loader import DeclaredCall


class BatchPredictor:
    """Wraps the user's object so that Sluice calls it the same way whatever it declares."""

    def __init__(self, built: BuiltPredictor) -> None:
        self.built = built
        predict = built.method("handle_batch", "predict")
        if predict is None:
            raise PredictorError(f"{type(built.instance).__name__} has neither handle_batch() nor predict()")
        self._predict = DeclaredCall(predict, ("payload", "batch_id"))
        complete = built.method("on_job_complete")
        self._on_job_complete = DeclaredCall(complete, ("job_status",)) if complete is not None else None

    @classmethod
    def build(
        cls, project_dir: Path, api: ApiConfig, job_spec: dict[str, Any], job_config: dict[str, Any],
        model_cache_dir: Path | None = None, poll_interval_s: float = 10.0,
    ) -> BatchPredictor:
        """Build the job's predictor: `config` is the API's config merged with the job's, plus `job_spec`.

        Raises `PredictorError` carrying the user's traceback when the import or `__init__`
        fails, or when the predictor has no method to run batches with.
        """
        config = merge_config(api.predictor.config, job_config)
        built = build_predictor(
            project_dir, api, {"config": config, "job_spec": job_spec},
            model_cache_dir=model_cache_dir or project_dir / ".sluice-models", poll_interval_s=poll_interval_s,
        )
        try:
            return cls(built)
        except BaseException:
            built.close()
            raise

    @property
    def instance(self) -> Any:
        """The user's predictor object."""
        return self.built.instance

    def close(self) -> None:
        """Stop live reloading and drop the job's modules; the job is over for this process."""
        self.built.close()

    @property
    def has_on_job_complete(self) -> bool:
        return self._on_job_complete is not None

    def predict(self, payload: Any, batch_id: str) -> Any:
        """Run one batch; the user's exceptions propagate unchanged for the caller to record."""
        with self.built.namespace.active():
            return self._predict({"payload": payload, "batch_id": batch_id})

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        if self._on_job_complete is None:
            return
        with self.built.namespace.active():
            self._on_job_complete({"job_status": job_status})
