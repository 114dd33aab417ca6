"""The client a python predictor receives, and what every model client shares.

A client owns a `ModelManager`, made by the factory it is given the first time a model is
asked for. Nothing is listed, downloaded or loaded before that, so a client can be built in a
parent process and used in forked workers without carrying a model (or CUDA) across the fork.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.errors import PredictorError

if TYPE_CHECKING:
    from predictors_runtime.models.manager import LoadedModel, ModelManager

ManagerFactory = Callable[[Callable[[Path], Any]], "ModelManager"]


class ModelClient:
    """Base of the clients: a lazily made model manager and live reloading switched on or off.

    Subclasses define `_load(path)`, which turns one version's local folder into what the
    manager keeps in memory.
    """

    def __init__(self, manager_factory: ManagerFactory) -> None:
        self._manager_factory = manager_factory
        self._manager: ModelManager | None = None
        self._lock = threading.Lock()
        self._reloading = False

    def _load(self, path: Path) -> Any:
        raise NotImplementedError

    @property
    def manager(self) -> ModelManager:
        """The model manager, made on first use; polling starts then if reloading was asked for."""
        manager = self._manager
        if manager is not None:
            return manager
        with self._lock:
            if self._manager is None:
                manager = self._manager_factory(self._load)
                if self._reloading:
                    manager.start_polling()
                self._manager = manager
            return self._manager

    def _loaded(self, model_name: str | None, model_version: str | int) -> LoadedModel:
        """One version of one model; the caller keeps it for the whole request, even across a reload."""
        return self.manager.get(model_name, model_version)

    def start_reloading(self) -> None:
        """Poll the model paths for changes from now on (from first use, if no model is loaded yet)."""
        with self._lock:
            self._reloading = True
            if self._manager is not None:
                self._manager.start_polling()

    def stop_reloading(self) -> None:
        """Stop polling the model paths; loaded models stay usable."""
        with self._lock:
            self._reloading = False
            if self._manager is not None:
                self._manager.stop_polling()


class PythonClient(ModelClient):
    """`python_client`: hands the predictor whatever its own `load_model(model_path)` returned.

    Sluice binds the predictor's `load_model` before the predictor's `__init__` runs, so
    `__init__` may already call `get_model()`. `model_path` is passed as a `str`, as Cortex
    did, so code such as `model_path + "/model.pkl"` keeps working.
    """

    def __init__(self, manager_factory: ManagerFactory) -> None:
        super().__init__(manager_factory)
        self._load_model: Callable[[str], Any] | None = None

    def bind(self, load_model: Callable[[str], Any]) -> None:
        """Use `load_model` to load every model version this client serves."""
        self._load_model = load_model

    def _load(self, path: Path) -> Any:
        if self._load_model is None:
            raise PredictorError(
                "python_client has no load_model bound; the predictor needs a load_model(self, model_path) method"
            )
        return self._load_model(str(path))

    def get_model(self, model_name: str | None = None, model_version: str | int = "latest") -> Any:
        """What `load_model` returned for that model and version ("latest" is the highest).

        `model_name` may be left out when the API serves a single model (`models.path`).
        """
        return self._loaded(model_name, model_version).model
