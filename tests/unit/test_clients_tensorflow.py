"""The tensorflow_client a predictor receives: a real SavedModel, saved here, run in-process.

Importing TensorFlow takes seconds, so every test of it lives in this one module and the
SavedModels are made once for the module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from predictors_runtime.clients import TensorFlowClient
from predictors_runtime.clients.tensorflow_client import pick_signature
from predictors_runtime.config import ModelsConfig
from foundation.errors import ConfigError, ModelInputError
from predictors_runtime.models.manager import ModelManager

W = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
B = np.array([0.5, -0.5], dtype=np.float32)


class Linear(tf.Module):  # type: ignore[misc]
    """y = x @ W + b, plus a few other signatures to choose from."""

    def __init__(self) -> None:
        super().__init__()
        self.w = tf.Variable(W)
        self.b = tf.Variable(B)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def serve(self, x: Any) -> dict[str, Any]:
        return {"y": tf.matmul(x, self.w) + self.b}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def double(self, x: Any) -> dict[str, Any]:
        return {"doubled": 2.0 * x, "total": tf.reduce_sum(x, axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None], tf.int64)])
    def shift(self, x: Any, steps: Any) -> dict[str, Any]:
        return {"shifted": x + tf.cast(steps, tf.float32)[:, None]}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def lengths(self, words: Any) -> dict[str, Any]:
        return {"length": tf.strings.length(words)}


def save(folder: Path, signatures: dict[str, str]) -> Path:
    """Save a `Linear` under `folder` with the named signatures (signature key -> method name)."""
    module = Linear()
    tf.saved_model.save(module, str(folder),
                        signatures={key: getattr(module, method) for key, method in signatures.items()})
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("savedmodels")
    every = {"serving_default": "serve", "double": "double", "shift": "shift", "lengths": "lengths"}
    return {
        "every": save(root / "every" / "1", every),
        "no_default": save(root / "no_default", {"double": "double", "shift": "shift"}),
        "only_double": save(root / "only_double", {"double": "double"}),
    }


def tf_client(tmp_path: Path, path: Path, signature_key: str | None = None, gpu: bool = False) -> TensorFlowClient:
    config = ModelsConfig(path=str(path))
    factory: Callable[[Callable[[Path], Any]], ModelManager] = (
        lambda load: ModelManager(config, "tensorflow", tmp_path / "cache", load, poll_interval_s=3600)
    )
    return TensorFlowClient(factory, signature_key=signature_key, gpu=gpu)


@pytest.fixture(scope="module")
def default_client(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> TensorFlowClient:
    return tf_client(tmp_path_factory.mktemp("cache"), models["every"].parent)


@pytest.fixture(scope="module")
def shift_client(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> TensorFlowClient:
    return tf_client(tmp_path_factory.mktemp("cache"), models["every"].parent, signature_key="shift")


# -- predicting --------------------------------------------------------------------------------
def test_predict_runs_serving_default_and_keys_outputs_by_name(default_client: TensorFlowClient) -> None:
    x = np.array([[1.0, 1.0], [0.0, 2.0]], dtype=np.float32)

    outputs = default_client.predict(x)

    assert list(outputs) == ["y"]
    assert isinstance(outputs["y"], np.ndarray)
    np.testing.assert_allclose(outputs["y"], x @ W + B)


def test_ints_are_cast_to_the_signatures_float_input(default_client: TensorFlowClient) -> None:
    outputs = default_client.predict({"x": [[1, 1], [0, 2]]})

    np.testing.assert_allclose(outputs["y"], [[4.5, 5.5], [6.5, 7.5]])
    assert outputs["y"].dtype == np.float32


def test_the_signature_key_chooses_another_signature(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["every"], signature_key="double")

    outputs = client.predict([[1, 2], [3, 4]])

    assert sorted(outputs) == ["doubled", "total"]
    np.testing.assert_allclose(outputs["doubled"], [[2, 4], [6, 8]])
    np.testing.assert_allclose(outputs["total"], [3, 7])
    assert client.get_model()["signature_key"] == "double"


def test_a_signature_with_two_inputs_takes_a_dict_cast_per_input(shift_client: TensorFlowClient) -> None:
    outputs = shift_client.predict({"x": [[1, 1], [2, 2]], "steps": [1.0, 10.0]})

    np.testing.assert_allclose(outputs["shifted"], [[2, 2], [12, 12]])


def test_string_inputs_are_passed_as_strings(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["every"], signature_key="lengths")

    assert client.predict(["a", "abc", ""])["length"].tolist() == [1, 3, 0]


def test_the_only_signature_is_used_when_none_is_named(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["only_double"])

    np.testing.assert_allclose(client.predict([[1, 1]])["doubled"], [[2, 2]])


# -- choosing the signature ------------------------------------------------------------------------
def test_an_unknown_signature_key_is_a_config_error_listing_the_models_keys(
    models: dict[str, Path], tmp_path: Path
) -> None:
    client = tf_client(tmp_path, models["every"], signature_key="predict")

    with pytest.raises(ConfigError) as caught:
        client.predict([[1, 2]])

    assert caught.value.message.endswith(
        "signature_key 'predict' is not a signature of the SavedModel; "
        "its signatures are: double, lengths, serving_default, shift"
    )


def test_several_signatures_without_a_default_need_a_signature_key(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["no_default"])

    with pytest.raises(ConfigError, match="set predictor.models.signature_key to one of: double, shift"):
        client.get_model()


def test_pick_signature_prefers_the_named_key_then_serving_default_then_the_only_one() -> None:
    assert pick_signature({"serving_default": 1, "a": 2}, "a", "m") == "a"
    assert pick_signature({"serving_default": 1, "a": 2}, None, "m") == "serving_default"
    assert pick_signature({"a": 2}, None, "m") == "a"
    with pytest.raises(ConfigError, match="m: the SavedModel has no signatures"):
        pick_signature({}, None, "m")


# -- input errors ------------------------------------------------------------------------------------
def test_a_wrong_dimension_is_refused_naming_the_input(default_client: TensorFlowClient) -> None:
    with pytest.raises(ModelInputError) as caught:
        default_client.predict([[1, 2, 3]])

    assert caught.value.message == "input 'x': expected shape [None, 2], got [1, 3] (dimension 1 must be 2, not 3)"


def test_a_wrong_rank_is_refused_naming_the_input(default_client: TensorFlowClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'x': expected 2 dimensions \(shape \[None, 2\]\), got 1"):
        default_client.predict({"x": [1, 2, 3]})


def test_a_bare_array_for_two_inputs_is_refused_naming_them(shift_client: TensorFlowClient) -> None:
    with pytest.raises(ModelInputError, match=r"the model has 2 inputs \(steps, x\)"):
        shift_client.predict([[1, 2]])


def test_unknown_and_missing_inputs_are_refused_by_name(shift_client: TensorFlowClient) -> None:
    with pytest.raises(ModelInputError, match=r"^unknown input 'step'; missing input 'steps' \(the model's inputs"):
        shift_client.predict({"x": [[1, 2]], "step": [1]})


def test_fractions_for_an_integer_input_are_refused(shift_client: TensorFlowClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'steps': expected int64 values, got numbers that are not whole"):
        shift_client.predict({"x": [[1, 2]], "steps": [0.5]})


def test_text_for_a_float_input_is_refused(default_client: TensorFlowClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'x': expected float32 values, got values that are not numbers"):
        default_client.predict([["one", "two"]])


# -- the model -----------------------------------------------------------------------------------------
def test_get_model_gives_the_loaded_model_its_signature_and_input_signatures(
    shift_client: TensorFlowClient,
) -> None:
    model = shift_client.get_model()

    assert model["input_signatures"] == {
        "steps": {"shape": [None], "type": "int64"},
        "x": {"shape": [None, 2], "type": "float32"},
    }
    assert model["signature"] is model["model"].signatures["shift"]
    np.testing.assert_allclose(model["model"].w.numpy(), W)


def test_asking_for_a_gpu_where_there_is_none_runs_on_the_cpu_with_a_warning(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    client = tf_client(tmp_path, models["every"], gpu=True)

    with caplog.at_level(logging.WARNING):
        outputs = client.predict([[1, 1]])

    np.testing.assert_allclose(outputs["y"], [[4.5, 5.5]])
    assert "compute.gpu > 0 but no GPU is available to TensorFlow; running on CPU" in caplog.text
