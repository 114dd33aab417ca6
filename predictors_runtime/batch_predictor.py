"""One instance of a user's batch predictor, built for one job and reused for all its batches."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

from .config import ApiConfig, ModelsConfig, merge_config
from .errors import PredictorError, SluiceError
from .loader import DeclaredCall, call_with_declared, error_text, load_predictor_class
from .project import read_dotenv
from .storage import split_uri

SUPPORTED_TYPES = ("python", "onnx", "tensorflow")


def resolve_model_paths(models: ModelsConfig, project_dir: Path) -> ModelsConfig:
    """Relative local model paths name folders inside the project (shipped with its bundle)."""

    def resolve(path: str) -> str:
        if split_uri(path)[0] or Path(path).is_absolute():
            return path
        return str((project_dir / path).resolve())

    update: dict[str, Any] = {}
    if models.path is not None:
        update["path"] = resolve(models.path)
    if models.dir is not None:
        update["dir"] = resolve(models.dir)
    if models.paths is not None:
        update["paths"] = [p.model_copy(update={"path": resolve(p.path)}) for p in models.paths]
    return models.model_copy(update=update)


def make_client(api: ApiConfig, project_dir: Path, model_cache_dir: Path, poll_interval_s: float) -> Any:
    """The model client a predictor of this type receives, or None for a python predictor without models."""
    predictor = api.predictor
    if predictor.models is None:
        return None
    from .clients import client_for
    from .models.manager import ModelManager

    models = resolve_model_paths(predictor.models, project_dir)

    def manager_factory(load: Any) -> ModelManager:
        return ModelManager(models, predictor.type, model_cache_dir, load, poll_interval_s=poll_interval_s)

    return client_for(predictor.type, manager_factory, signature_key=models.signature_key, gpu=api.compute.gpu > 0)


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

    def __init__(self, instance: Any, project_dir: Path, client: Any = None) -> None:
        self._instance = instance
        self._project_dir = project_dir
        self._client = client
        predict = getattr(instance, "handle_batch", None) or getattr(instance, "predict", None)
        if not callable(predict):
            raise PredictorError(f"{type(instance).__name__} has neither handle_batch() nor predict()")
        self._predict = DeclaredCall(predict, ("payload", "batch_id"))
        complete = getattr(instance, "on_job_complete", None)
        self._on_job_complete = DeclaredCall(complete, ("job_status",)) if callable(complete) else None

    @classmethod
    def build(
        cls, project_dir: Path, api: ApiConfig, job_spec: dict[str, Any], job_config: dict[str, Any],
        model_cache_dir: Path | None = None, poll_interval_s: float = 10.0,
    ) -> "BatchPredictor":
        """Import the predictor module and construct it with the merged config and its model client.

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
            available: dict[str, Any] = {"config": config, "job_spec": job_spec}
            cache = model_cache_dir or project_dir / ".sluice-models"
            try:
                client = make_client(api, project_dir, cache, poll_interval_s)
            except SluiceError as e:
                raise PredictorError(f"preparing the model client failed: {e.message}") from e
            # Made before __init__ runs, so the python client can call load_model from __init__.
            instance = predictor_class.__new__(predictor_class)
            if client is not None:
                from .clients import CLIENT_ARGUMENT

                if predictor.type == "python":
                    load_model = getattr(instance, "load_model", None)
                    if not callable(load_model):
                        raise PredictorError(
                            f"{predictor_class.__name__} needs a load_model(self, model_path) method "
                            "to use predictor.models (multi_model_reloading)"
                        )
                    client.bind(load_model)
                available[CLIENT_ARGUMENT[predictor.type]] = client
            try:
                if predictor_class.__init__ is not object.__init__:  # a class may define no constructor
                    call_with_declared(instance.__init__, available)
            except PredictorError:
                raise
            except BaseException as e:
                raise PredictorError(f"{predictor_class.__name__}.__init__ raised: {error_text(e)}") from e
        if client is not None:
            client.start_reloading()
        return cls(instance, project_dir, client)

    def close(self) -> None:
        """Stop live reloading; the job is over for this process."""
        if self._client is not None:
            self._client.stop_reloading()

    @property
    def has_on_job_complete(self) -> bool:
        return self._on_job_complete is not None

    def predict(self, payload: Any, batch_id: str) -> Any:
        """Run one batch; the user's exceptions propagate unchanged for the caller to record."""
        with working_directory(self._project_dir):
            return self._predict({"payload": payload, "batch_id": batch_id})

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        if self._on_job_complete is None:
            return
        with working_directory(self._project_dir):
            self._on_job_complete({"job_status": job_status})
