"""The onnx_client a predictor receives: real onnxruntime sessions on tiny models made here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from foundation.errors import ModelInputError, ModelNotFound
from predictors_runtime.clients import ONNXClient
from predictors_runtime.clients.onnx_client import InputSpec, OnnxModel
from predictors_runtime.config import ModelsConfig
from predictors_runtime.models.manager import LoadedModel, ModelManager

IRIS_X, IRIS_Y = load_iris(return_X_y=True)


@pytest.fixture(scope="module")
def iris() -> LogisticRegression:
    return LogisticRegression(max_iter=1000).fit(IRIS_X, IRIS_Y)


@pytest.fixture(scope="module")
def iris_onnx(iris: LogisticRegression) -> bytes:
    """The classifier converted without ZipMap: outputs `label` [N] int64 and `probabilities` [N, 3]."""
    model = to_onnx(iris, IRIS_X[:1].astype(np.float32), options={LogisticRegression: {"zipmap": False}},
                    target_opset=17)
    return model.SerializeToString()


def graph(nodes: list[Any], inputs: list[Any], outputs: list[Any]) -> bytes:
    model = helper.make_model(helper.make_graph(nodes, "test", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def add_graph(op: str = "Add") -> bytes:
    """y = a <op> b, for two float inputs of shape [None, 3]."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])
    return graph([helper.make_node(op, ["a", "b"], ["y"])], [a, b], [y])


def typed_graph() -> bytes:
    """Echoes one input of each kind the casting handles: int64, uint8, bool, string."""
    kinds = {"ids": TensorProto.INT64, "small": TensorProto.UINT8, "flags": TensorProto.BOOL,
             "words": TensorProto.STRING}
    inputs = [helper.make_tensor_value_info(name, kind, [None]) for name, kind in kinds.items()]
    outputs = [helper.make_tensor_value_info(f"{name}_out", kind, [None]) for name, kind in kinds.items()]
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name in kinds]
    return graph(nodes, inputs, outputs)


def scalar_graph() -> bytes:
    """y = x * k, with k a scalar (which onnxruntime reports as shape [], like a shapeless input)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])
    return graph([helper.make_node("Mul", ["x", "k"], ["y"])], [x, k], [y])


def write_model(folder: Path, data: bytes, name: str = "model.onnx") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder


def client_for_models(tmp_path: Path, gpu: bool = False, **models: Any) -> ONNXClient:
    """An ONNXClient over the real ModelManager, serving local folders."""
    config = ModelsConfig(**models)

    def factory(load: Callable[[Path], Any]) -> ModelManager:
        return ModelManager(config, "onnx", tmp_path / "cache", load, poll_interval_s=3600)

    return ONNXClient(factory, gpu=gpu)


@pytest.fixture
def iris_client(tmp_path: Path, iris_onnx: bytes) -> ONNXClient:
    return client_for_models(tmp_path, path=str(write_model(tmp_path / "iris", iris_onnx)))


@pytest.fixture
def add_client(tmp_path: Path) -> ONNXClient:
    return client_for_models(tmp_path, path=str(write_model(tmp_path / "add", add_graph())))


@pytest.fixture
def typed_client(tmp_path: Path) -> ONNXClient:
    return client_for_models(tmp_path, path=str(write_model(tmp_path / "typed", typed_graph())))


# -- predicting --------------------------------------------------------------------------------
def test_predictions_match_the_sklearn_model_they_were_converted_from(
    iris_client: ONNXClient, iris: LogisticRegression
) -> None:
    labels, probabilities = iris_client.predict(IRIS_X.astype(np.float32))

    np.testing.assert_array_equal(labels, iris.predict(IRIS_X))
    np.testing.assert_allclose(probabilities, iris.predict_proba(IRIS_X), atol=1e-5)


def test_predict_returns_one_entry_per_output_in_the_sessions_order(iris_client: ONNXClient) -> None:
    outputs = iris_client.predict([[5.1, 3.5, 1.4, 0.2]])
    names = list(iris_client.get_model()["signatures"]["outputs"])

    assert isinstance(outputs, list)
    assert names == ["label", "probabilities"]
    assert outputs[0].shape == (1,) and outputs[1].shape == (1, 3)


def test_a_list_of_ints_feeds_a_float_input(iris_client: ONNXClient) -> None:
    from_ints = iris_client.predict([[6, 3, 5, 2], [5, 3, 1, 0]])
    from_floats = iris_client.predict(np.array([[6.0, 3.0, 5.0, 2.0], [5.0, 3.0, 1.0, 0.0]]))

    np.testing.assert_array_equal(from_ints[0], from_floats[0])
    np.testing.assert_allclose(from_ints[1], from_floats[1])


def test_a_single_input_model_takes_a_dict_or_the_bare_values_alike(iris_client: ONNXClient) -> None:
    rows = IRIS_X[:5].tolist()

    bare = iris_client.predict(rows)
    named = iris_client.predict({"X": rows})

    np.testing.assert_array_equal(bare[0], named[0])
    np.testing.assert_allclose(bare[1], named[1])


def test_a_model_with_two_inputs_takes_a_dict_of_named_inputs(add_client: ONNXClient) -> None:
    [y] = add_client.predict({"a": [[1, 2, 3], [4, 5, 6]], "b": [[0.5, 0.5, 0.5], [1, 1, 1]]})

    np.testing.assert_allclose(y, [[1.5, 2.5, 3.5], [5, 6, 7]])
    assert y.dtype == np.float32


def test_inputs_are_cast_to_each_inputs_own_type(typed_client: ONNXClient) -> None:
    ids, small, flags, words = typed_client.predict(
        {"ids": [1.0, 2.0, 3.0], "small": [0, 255, 7], "flags": [1, 0, 1], "words": ["a", "bc", ""]}
    )

    assert ids.dtype == np.int64 and ids.tolist() == [1, 2, 3]
    assert small.dtype == np.uint8 and small.tolist() == [0, 255, 7]
    assert flags.dtype == np.bool_ and flags.tolist() == [True, False, True]
    assert words.tolist() == ["a", "bc", ""]


def test_numbers_written_as_text_are_read_as_numbers(typed_client: ONNXClient) -> None:
    ids, *_ = typed_client.predict({"ids": ["4", "5"], "small": [1, 1], "flags": [True, True], "words": ["x", "y"]})

    assert ids.tolist() == [4, 5]


# -- input errors --------------------------------------------------------------------------------
def test_a_bare_array_for_a_model_with_several_inputs_is_refused_naming_its_inputs(add_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"the model has 2 inputs \(a, b\); pass model_input as a dict"):
        add_client.predict([[1, 2, 3]])


def test_unknown_input_names_are_refused_listing_the_models_inputs(add_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError) as caught:
        add_client.predict({"a": [[1, 2, 3]], "b": [[1, 2, 3]], "c": [[1, 2, 3]]})

    assert caught.value.message == "unknown input 'c' (the model's inputs are: a, b)"
    assert caught.value.kind == "invalid_model_input" and caught.value.http_status == 400


def test_missing_inputs_are_refused_by_name(add_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"^missing input 'b' \(the model's inputs are: a, b\)$"):
        add_client.predict({"a": [[1, 2, 3]]})


def test_a_wrong_name_for_a_single_input_model_is_refused_as_unknown_and_missing(iris_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"unknown input 'features'; missing input 'X'"):
        iris_client.predict({"features": [[1, 2, 3, 4]]})


def test_a_single_sample_without_a_batch_dimension_is_a_batch_of_one_as_in_cortex(iris_client: ONNXClient) -> None:
    # Cortex's ONNX iris predictor passes one flower as a flat list.
    labels, probabilities = iris_client.predict([5.1, 3.5, 1.4, 0.2])

    batched = iris_client.predict([[5.1, 3.5, 1.4, 0.2]])
    assert labels.tolist() == batched[0].tolist() and probabilities.shape == (1, 3)


def test_a_single_sample_of_the_wrong_size_is_refused_naming_the_shape(iris_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError) as caught:
        iris_client.predict([5.1, 3.5, 1.4])

    assert caught.value.message == "input 'X': expected 2 dimensions (shape [None, 4]), got 1 (shape [3])"


def test_a_wrong_fixed_dimension_is_refused_naming_the_input_and_dimension(add_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError) as caught:
        add_client.predict({"a": [[1, 2, 3]], "b": [[1, 2, 3, 4]]})

    assert caught.value.message == "input 'b': expected shape [None, 3], got [1, 4] (dimension 1 must be 3, not 4)"


def test_ragged_rows_are_refused(iris_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'X': expected float32 values .*do not form an array"):
        iris_client.predict([[1, 2, 3, 4], [1, 2, 3]])


def test_text_that_is_not_a_number_is_refused(iris_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'X': expected float32 values, got values that are not numbers"):
        iris_client.predict([["5.1", "3.5", "wide", "0.2"]])


def test_fractions_for_an_integer_input_are_refused_not_truncated(typed_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'ids': expected int64 values, got numbers that are not whole"):
        typed_client.predict({"ids": [1.5], "small": [1], "flags": [True], "words": ["x"]})


def test_numbers_outside_an_integer_inputs_range_are_refused(typed_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'small': expected uint8 values, got numbers out of its range"):
        typed_client.predict({"ids": [1], "small": [256], "flags": [True], "words": ["x"]})


def test_numbers_other_than_0_and_1_for_a_bool_input_are_refused(typed_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'flags': expected bool values, got int64 values"):
        typed_client.predict({"ids": [1], "small": [1], "flags": [2], "words": ["x"]})


def test_numbers_for_a_string_input_are_refused(typed_client: ONNXClient) -> None:
    with pytest.raises(ModelInputError, match=r"input 'words': expected string values, got int64 values"):
        typed_client.predict({"ids": [1], "small": [1], "flags": [True], "words": [1]})


def test_a_scalar_input_takes_a_scalar(tmp_path: Path) -> None:
    client = client_for_models(tmp_path, path=str(write_model(tmp_path / "scalar", scalar_graph())))

    [y] = client.predict({"x": [1, 2], "k": 3})

    assert y.tolist() == [3, 6]
    assert client.get_model()["input_signatures"]["k"] == {"shape": None, "type": "float32"}


def test_an_input_onnxruntime_rejects_after_the_checks_is_still_a_model_input_error(tmp_path: Path) -> None:
    from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

    class Session:
        def run(self, outputs: Any, feed: dict[str, Any]) -> list[Any]:
            raise InvalidArgument("Got invalid dimensions for input: x")

    class Manager:
        def get(self, model_name: str | None = None, model_version: str | int = "latest") -> LoadedModel:
            spec = InputSpec("x", (None,), np.dtype(np.float32), "float32")
            return LoadedModel("_default", 1, tmp_path, OnnxModel(Session(), {}, (spec,)))

    client = ONNXClient(lambda load: Manager())  # type: ignore[arg-type, return-value]

    with pytest.raises(ModelInputError, match=r"^the model rejected its input: Got invalid dimensions for input: x$"):
        client.predict([1.0])


# -- the model and its signatures -----------------------------------------------------------------
def test_get_model_gives_the_session_and_the_input_signatures(iris_client: ONNXClient) -> None:
    model = iris_client.get_model()

    assert isinstance(model["session"], onnxruntime.InferenceSession)
    assert model["input_signatures"] == {"X": {"shape": [None, 4], "type": "float32"}}
    assert model["signatures"] == {
        "inputs": {"X": {"shape": [None, 4], "type": "float32", "onnx_type": "tensor(float)"}},
        "outputs": {
            "label": {"shape": [None], "type": "int64", "onnx_type": "tensor(int64)"},
            "probabilities": {"shape": [None, 3], "type": "float32", "onnx_type": "tensor(float)"},
        },
    }


def test_symbolic_dimensions_are_named_in_signatures_and_none_in_input_signatures(add_client: ONNXClient) -> None:
    model = add_client.get_model()

    assert model["signatures"]["inputs"]["b"]["shape"] == ["batch", 3]
    assert model["input_signatures"]["b"] == {"shape": [None, 3], "type": "float32"}


def test_string_and_bool_inputs_report_numpy_type_names(typed_client: ONNXClient) -> None:
    types = {name: sig["type"] for name, sig in typed_client.get_model()["input_signatures"].items()}

    assert types == {"ids": "int64", "small": "uint8", "flags": "bool", "words": "object"}


def test_get_model_returns_a_copy_of_the_signatures(iris_client: ONNXClient) -> None:
    iris_client.get_model()["signatures"]["inputs"].clear()

    assert iris_client.get_model()["signatures"]["inputs"]


# -- models and versions -------------------------------------------------------------------------
def test_a_version_can_be_asked_for_and_latest_is_the_highest(tmp_path: Path) -> None:
    write_model(tmp_path / "calc" / "1", add_graph("Add"))
    write_model(tmp_path / "calc" / "2", add_graph("Sub"))
    client = client_for_models(tmp_path, path=str(tmp_path / "calc"))
    feed = {"a": [[5, 5, 5]], "b": [[1, 2, 3]]}

    assert client.predict(feed)[0].tolist() == [[4, 3, 2]]
    assert client.predict(feed, model_version="1")[0].tolist() == [[6, 7, 8]]
    assert client.predict(feed, None, 2)[0].tolist() == [[4, 3, 2]]


def test_models_are_chosen_by_name(tmp_path: Path, iris_onnx: bytes) -> None:
    client = client_for_models(tmp_path, paths=[
        {"name": "iris", "path": str(write_model(tmp_path / "iris", iris_onnx))},
        {"name": "add", "path": str(write_model(tmp_path / "add", add_graph()))},
    ])

    assert client.predict({"a": [[1, 1, 1]], "b": [[1, 1, 1]]}, "add")[0].tolist() == [[2, 2, 2]]
    assert client.predict([[5.1, 3.5, 1.4, 0.2]], "iris")[0].tolist() == [0]
    with pytest.raises(ModelNotFound, match="no model named 'mul'"):
        client.predict([[1, 1, 1]], "mul")


def test_nothing_is_loaded_before_the_first_use(tmp_path: Path) -> None:
    made: list[Any] = []
    ONNXClient(lambda load: made.append(load))  # type: ignore[arg-type, func-returns-value]

    assert made == []


# -- hardware --------------------------------------------------------------------------------------
def test_asking_for_a_gpu_without_cuda_runs_on_the_cpu_with_a_warning(
    tmp_path: Path, iris_onnx: bytes, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    client = client_for_models(tmp_path, gpu=True, path=str(write_model(tmp_path / "iris", iris_onnx)))

    with caplog.at_level(logging.WARNING):
        session = client.get_model()["session"]

    assert session.get_providers() == ["CPUExecutionProvider"]
    assert "compute.gpu > 0 but CUDA is not available to onnxruntime; running on CPU" in caplog.text
    assert client.predict([[5.1, 3.5, 1.4, 0.2]])[0].tolist() == [0]


def test_without_a_gpu_sessions_use_only_the_cpu(iris_client: ONNXClient) -> None:
    assert iris_client.get_model()["session"].get_providers() == ["CPUExecutionProvider"]


def test_loading_a_model_logs_the_providers_its_session_uses_so_a_gpu_host_shows_where_it_runs(
    tmp_path: Path, iris_onnx: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    client = client_for_models(tmp_path, path=str(write_model(tmp_path / "iris", iris_onnx)))

    with caplog.at_level(logging.INFO, logger="predictors_runtime.clients.onnx_client"):
        client.get_model()

    loaded = [r.getMessage() for r in caplog.records if "loaded with onnxruntime providers" in r.getMessage()]
    assert len(loaded) == 1
    assert loaded[0].endswith("model.onnx: loaded with onnxruntime providers CPUExecutionProvider")


def test_session_threads_follow_omp_num_threads_because_onnxruntime_ignores_it() -> None:
    from predictors_runtime.clients.hardware import cpu_threads

    assert cpu_threads({"OMP_NUM_THREADS": "1"}) == 1
    assert cpu_threads({"OMP_NUM_THREADS": "4"}) == 4
    assert cpu_threads({}) is None
    assert cpu_threads({"OMP_NUM_THREADS": "lots"}) is None
    assert cpu_threads({"OMP_NUM_THREADS": "0"}) is None
