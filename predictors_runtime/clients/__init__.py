"""The model clients handed to predictors: `python_client`, `onnx_client`, `tensorflow_client`."""

from __future__ import annotations

from predictors_runtime.errors import ConfigError

from .onnx_client import ONNXClient
from .python_client import ManagerFactory, ModelClient, PythonClient
from .tensorflow_client import TensorFlowClient

__all__ = ["CLIENT_ARGUMENT", "ModelClient", "ONNXClient", "PythonClient", "TensorFlowClient", "client_for"]

# The constructor argument through which each predictor type receives its client.
CLIENT_ARGUMENT = {"python": "python_client", "onnx": "onnx_client", "tensorflow": "tensorflow_client"}


def client_for(
    predictor_type: str, manager_factory: ManagerFactory, signature_key: str | None = None, gpu: bool = False
) -> ModelClient:
    """The client for a predictor type; `manager_factory(load)` is called on its first use."""
    if predictor_type == "python":
        return PythonClient(manager_factory)
    if predictor_type == "onnx":
        return ONNXClient(manager_factory, gpu=gpu)
    if predictor_type == "tensorflow":
        return TensorFlowClient(manager_factory, signature_key=signature_key, gpu=gpu)
    raise ConfigError(f"predictor type {predictor_type!r} has no model client (one of: {', '.join(CLIENT_ARGUMENT)})")
