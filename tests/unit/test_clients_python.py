"""The python_client, the choice of client per predictor type, and the hardware checks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import ConfigError, ModelNotFound, PredictorError
from predictors_runtime.clients import (
    CLIENT_ARGUMENT,
    ONNXClient,
    PythonClient,
    TensorFlowClient,
    client_for,
)
from predictors_runtime.clients.hardware import onnx_providers, tensorflow_device
from predictors_runtime.config import ModelsConfig
from predictors_runtime.models.manager import LoadedModel, ModelManager


def model_folder(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.txt").write_text(text)
    return folder


class Recorder:
    """A predictor's load_model: reads model.txt and remembers every path it was given."""

    def __init__(self) -> None:
        self.paths: list[Any] = []

    def __call__(self, model_path: Any) -> dict[str, Any]:
        self.paths.append(model_path)
        return {"text": (Path(model_path) / "model.txt").read_text()}


def python_client(tmp_path: Path, **models: Any) -> PythonClient:
    config = ModelsConfig(**models)

    def factory(load: Callable[[Path], Any]) -> ModelManager:
        return ModelManager(config, "python", tmp_path / "cache", load, poll_interval_s=3600)

    return PythonClient(factory)


# -- python_client -------------------------------------------------------------------------------
def test_get_model_returns_what_load_model_returned(tmp_path: Path) -> None:
    client = python_client(tmp_path, path=str(model_folder(tmp_path / "m", "hello")))
    load_model = Recorder()
    client.bind(load_model)

    assert client.get_model() == {"text": "hello"}


def test_load_model_gets_the_local_folder_as_a_string_as_in_cortex(tmp_path: Path) -> None:
    client = python_client(tmp_path, path=str(model_folder(tmp_path / "m", "hello")))
    load_model = Recorder()
    client.bind(load_model)

    client.get_model()

    [path] = load_model.paths
    assert isinstance(path, str)
    assert (Path(path) / "model.txt").read_text() == "hello"


def test_a_model_is_loaded_once_and_then_served_from_memory(tmp_path: Path) -> None:
    client = python_client(tmp_path, path=str(model_folder(tmp_path / "m", "hello")))
    load_model = Recorder()
    client.bind(load_model)

    first, second = client.get_model(), client.get_model(None, "latest")

    assert first is second
    assert len(load_model.paths) == 1


def test_named_models_and_their_versions_are_served_separately(tmp_path: Path) -> None:
    model_folder(tmp_path / "a" / "1", "a1")
    model_folder(tmp_path / "a" / "7", "a7")
    model_folder(tmp_path / "b", "b")
    client = python_client(tmp_path, paths=[{"name": "a", "path": str(tmp_path / "a")},
                                            {"name": "b", "path": str(tmp_path / "b")}])
    client.bind(Recorder())

    assert client.get_model("a") == {"text": "a7"}
    assert client.get_model("a", "1") == {"text": "a1"}
    assert client.get_model("a", 7) == {"text": "a7"}
    assert client.get_model("b") == {"text": "b"}
    with pytest.raises(ModelNotFound, match="a model name is required"):
        client.get_model()
    with pytest.raises(ModelNotFound, match="no version 3"):
        client.get_model("a", 3)


def test_a_new_version_becomes_latest_after_a_reload_step(tmp_path: Path) -> None:
    model_folder(tmp_path / "m" / "1", "v1")
    client = python_client(tmp_path, path=str(tmp_path / "m"))
    client.bind(Recorder())
    assert client.get_model() == {"text": "v1"}

    model_folder(tmp_path / "m" / "2", "v2")
    client.manager.poll_once(now=1.0)

    assert client.get_model() == {"text": "v2"}
    assert client.get_model(model_version=1) == {"text": "v1"}


def test_get_model_without_a_bound_load_model_says_what_is_missing(tmp_path: Path) -> None:
    client = python_client(tmp_path, path=str(model_folder(tmp_path / "m", "hello")))

    with pytest.raises(PredictorError, match=r"needs a load_model\(self, model_path\) method"):
        client.get_model()


# -- laziness and live reloading (with a fake manager that records its calls) ---------------------
class FakeManager:
    """The ModelManager interface, serving `load(path)` for one folder and recording polling calls."""

    def __init__(self, load: Callable[[Path], Any], folder: Path) -> None:
        self.load = load
        self.folder = folder
        self.calls: list[str] = []
        self.model: Any = None

    def get(self, model_name: str | None = None, model_version: str | int = "latest") -> LoadedModel:
        if self.model is None:
            self.model = self.load(self.folder)
        return LoadedModel("_default", 1, self.folder, self.model)

    def start_polling(self) -> None:
        self.calls.append("start")

    def stop_polling(self) -> None:
        self.calls.append("stop")


def fake_client(tmp_path: Path) -> tuple[PythonClient, list[FakeManager]]:
    made: list[FakeManager] = []

    def factory(load: Callable[[Path], Any]) -> Any:
        made.append(FakeManager(load, model_folder(tmp_path / "m", "fake")))
        return made[-1]

    client = PythonClient(factory)
    client.bind(Recorder())
    return client, made


def test_the_manager_is_made_on_first_use_not_before(tmp_path: Path) -> None:
    client, made = fake_client(tmp_path)
    assert made == []

    client.get_model()
    client.get_model()

    assert len(made) == 1


def test_reloading_asked_for_before_first_use_starts_when_the_manager_is_made(tmp_path: Path) -> None:
    client, made = fake_client(tmp_path)

    client.start_reloading()
    assert made == []
    client.get_model()

    assert made[0].calls == ["start"]


def test_reloading_starts_and_stops_an_existing_manager(tmp_path: Path) -> None:
    client, made = fake_client(tmp_path)
    client.get_model()

    client.start_reloading()
    client.stop_reloading()

    assert made[0].calls == ["start", "stop"]


def test_reloading_stopped_before_first_use_never_starts(tmp_path: Path) -> None:
    client, made = fake_client(tmp_path)

    client.start_reloading()
    client.stop_reloading()
    client.get_model()

    assert made[0].calls == []


# -- choosing a client ---------------------------------------------------------------------------
def test_each_predictor_type_gets_its_client_under_its_cortex_argument_name() -> None:
    def factory(load: Callable[[Path], Any]) -> Any:
        raise AssertionError("not used")

    assert isinstance(client_for("python", factory), PythonClient)
    assert isinstance(client_for("onnx", factory, gpu=True), ONNXClient)
    assert isinstance(client_for("tensorflow", factory, signature_key="predict"), TensorFlowClient)
    assert CLIENT_ARGUMENT == {"python": "python_client", "onnx": "onnx_client", "tensorflow": "tensorflow_client"}


def test_an_unknown_predictor_type_has_no_client() -> None:
    with pytest.raises(ConfigError, match="predictor type 'torch' has no model client"):
        client_for("torch", lambda load: None)  # type: ignore[arg-type, return-value]


# Importing the clients imports no runtime, in a fresh interpreter:
# tests/integration/test_process_imports_clients.py.


# -- hardware ------------------------------------------------------------------------------------
def test_onnx_uses_cuda_first_when_a_gpu_is_asked_for_and_available() -> None:
    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]

    assert onnx_providers(True, available) == ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_onnx_falls_back_to_the_cpu_with_a_warning_when_cuda_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert onnx_providers(True, ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]

    assert "compute.gpu > 0 but CUDA is not available to onnxruntime; running on CPU" in caplog.text


def test_onnx_without_a_gpu_uses_the_cpu_even_where_cuda_exists(caplog: pytest.LogCaptureFixture) -> None:
    assert onnx_providers(False, ["CUDAExecutionProvider", "CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert caplog.text == ""


def test_tensorflow_runs_on_the_gpu_only_when_asked_and_one_is_visible(caplog: pytest.LogCaptureFixture) -> None:
    assert tensorflow_device(True, ["PhysicalDevice(GPU:0)"]) == "/GPU:0"
    assert tensorflow_device(False, ["PhysicalDevice(GPU:0)"]) == "/CPU:0"
    with caplog.at_level(logging.WARNING):
        assert tensorflow_device(True, []) == "/CPU:0"

    assert "compute.gpu > 0 but no GPU is available to TensorFlow; running on CPU" in caplog.text
