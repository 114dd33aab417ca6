"""The model clients handed to predictors: `python_client`, `onnx_client`, `tensorflow_client`."""

from __future__ import annotations

from collections.abc import Callable

from foundation.errors import ConfigError
from predictors_runtime.predictor_types import PREDICTOR_TYPES

from .onnx_client import ONNXClient
from .python_client import ManagerFactory, ModelClient, PythonClient
from .tensorflow_client import TensorFlowClient

__all__ = ["CLIENT_ARGUMENT", "ModelClient", "ONNXClient", "PythonClient", "TensorFlowClient", "client_for"]

# The constructor argument through which each predictor type receives its client.
CLIENT_ARGUMENT = {name: kind.client_argument for name, kind in PREDICTOR_TYPES.items()}

# How each registered type's client is made: (manager factory, signature key, gpu) -> client.
CLIENTS: dict[str, Callable[[ManagerFactory, str | None, bool], ModelClient]] = {
    "python": lambda factory, _signature_key, _gpu: PythonClient(factory),
    "onnx": lambda factory, _signature_key, gpu: ONNXClient(factory, gpu=gpu),
    "tensorflow": lambda factory, signature_key, gpu: TensorFlowClient(factory, signature_key=signature_key, gpu=gpu),
}


def client_for(
    predictor_type: str, manager_factory: ManagerFactory, signature_key: str | None = None, gpu: bool = False
) -> ModelClient:
    """The client for a predictor type; `manager_factory(load)` is called on its first use."""
    make = CLIENTS.get(predictor_type)
    if make is not None:
        return make(manager_factory, signature_key, gpu)
    raise ConfigError(f"predictor type {predictor_type!r} has no model client (one of: {', '.join(CLIENT_ARGUMENT)})")
