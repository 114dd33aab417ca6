"""One instance of a user's batch predictor, built for one job and reused for all its batches."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from .config import ApiConfig, merge_config
from .errors import PredictorError
from .loader import call_with_declared, error_text, load_predictor_class
from .project import read_dotenv

SUPPORTED_TYPES = ("python",)


@contextlib.contextmanager
def working_directory(folder: Path) -> Iterator[None]:
    """Run user code with the project folder as its working directory, as Cortex does."""
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


class BatchPredictor:
    """Wraps the user's object so that Sluice calls it the same way whatever it declares."""

    def __init__(self, instance: Any, project_dir: Path) -> None:
        self._instance = instance
        self._project_dir = project_dir
        predict = getattr(instance, "handle_batch", None) or getattr(instance, "predict", None)
        if not callable(predict):
            raise PredictorError(f"{type(instance).__name__} has neither handle_batch() nor predict()")
        self._predict = predict
        complete = getattr(instance, "on_job_complete", None)
        self._on_job_complete = complete if callable(complete) else None

    @classmethod
    def build(
        cls, project_dir: Path, api: ApiConfig, job_spec: dict[str, Any], job_config: dict[str, Any]
    ) -> "BatchPredictor":
        """Import the predictor module and construct it with the merged config.

        Raises `PredictorError` carrying the user's traceback when the import or `__init__` fails.
        """
        predictor = api.predictor
        if predictor.type not in SUPPORTED_TYPES:
            raise PredictorError(f"predictor type {predictor.type!r} is not supported by this worker")
        os.environ.update(read_dotenv(project_dir))
        os.environ.update({k: str(v) for k, v in predictor.env.items()})
        for extra in (predictor.python_path, "."):
            if extra is None:
                continue
            folder = str((project_dir / extra).resolve())
            if folder not in sys.path:
                sys.path.insert(0, folder)
        with working_directory(project_dir):
            predictor_class = load_predictor_class(project_dir, predictor.path, module_tag=str(project_dir))
            config = merge_config(predictor.config, job_config)
            try:
                instance = call_with_declared(predictor_class, {"config": config, "job_spec": job_spec})
            except PredictorError:
                raise
            except BaseException as e:
                raise PredictorError(f"{predictor_class.__name__}.__init__ raised: {error_text(e)}") from e
        return cls(instance, project_dir)

    @property
    def has_on_job_complete(self) -> bool:
        return self._on_job_complete is not None

    def predict(self, payload: Any, batch_id: str) -> Any:
        """Run one batch; the user's exceptions propagate unchanged for the caller to record."""
        with working_directory(self._project_dir):
            return call_with_declared(self._predict, {"payload": payload, "batch_id": batch_id})

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        if self._on_job_complete is None:
            return
        with working_directory(self._project_dir):
            call_with_declared(self._on_job_complete, {"job_status": job_status})
