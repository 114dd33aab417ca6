"""The tensorflow_client a predictor receives: a real SavedModel, saved here, run in-process.

Importing TensorFlow takes seconds, so every test of it lives in this one module and the
SavedModels are made once for the module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from foundation.errors import ConfigError, ModelInputError
from predictors_runtime.clients import TensorFlowClient
from predictors_runtime.clients.tensorflow_client import pick_signature
from predictors_runtime.clients.tensorflow_outputs import cortex_values
from predictors_runtime.config import ModelsConfig
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

    def factory(load: Callable[[Path], Any]) -> ModelManager:
        return ModelManager(config, "tensorflow", tmp_path / "cache", load, poll_interval_s=3600)

    return TensorFlowClient(factory, signature_key=signature_key, gpu=gpu)


@pytest.fixture(scope="module")
def default_client(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> TensorFlowClient:
    return tf_client(tmp_path_factory.mktemp("cache"), models["every"].parent)


@pytest.fixture(scope="module")
def shift_client(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> TensorFlowClient:
    return tf_client(tmp_path_factory.mktemp("cache"), models["every"].parent, signature_key="shift")


def floats(values: Any) -> list[Any]:
    """Float32 values as Cortex's client gave an output: flat, each float32 at its shortest."""
    return cortex_values(np.asarray(values, dtype=np.float32))


# -- predicting --------------------------------------------------------------------------------
def test_predict_runs_serving_default_and_keys_outputs_by_name(default_client: TensorFlowClient) -> None:
    x = np.array([[1.0, 1.0], [0.0, 2.0]], dtype=np.float32)

    outputs = default_client.predict(x)

    assert list(outputs) == ["y"]
    assert isinstance(outputs["y"], list)  # flat, as Cortex's client gave each output
    assert outputs["y"] == pytest.approx(floats(x @ W + B))


def test_ints_are_cast_to_the_signatures_float_input(default_client: TensorFlowClient) -> None:
    outputs = default_client.predict({"x": [[1, 1], [0, 2]]})

    assert outputs["y"] == pytest.approx(floats([[4.5, 5.5], [6.5, 7.5]]))
    assert all(isinstance(value, float) for value in outputs["y"])


def test_the_signature_key_chooses_another_signature(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["every"], signature_key="double")

    outputs = client.predict([[1, 2], [3, 4]])

    assert sorted(outputs) == ["doubled", "total"]
    assert outputs["doubled"] == pytest.approx(floats([[2, 4], [6, 8]]))
    assert outputs["total"] == pytest.approx(floats([3, 7]))
    assert client.get_model()["signature_key"] == "double"


def test_a_signature_with_two_inputs_takes_a_dict_cast_per_input(shift_client: TensorFlowClient) -> None:
    outputs = shift_client.predict({"x": [[1, 1], [2, 2]], "steps": [1.0, 10.0]})

    assert outputs["shifted"] == pytest.approx(floats([[2, 2], [12, 12]]))


def test_string_inputs_are_passed_as_strings(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["every"], signature_key="lengths")

    assert client.predict(["a", "abc", ""])["length"] == [1, 3, 0]  # int32: numbers (int64 would be strings)


def test_the_only_signature_is_used_when_none_is_named(models: dict[str, Path], tmp_path: Path) -> None:
    client = tf_client(tmp_path, models["only_double"])

    assert client.predict([[1, 1]])["doubled"] == pytest.approx(floats([[2, 2]]))


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

    assert outputs["y"] == pytest.approx(floats([[4.5, 5.5]]))
    assert "compute.gpu > 0 but no GPU is available to TensorFlow; running on CPU" in caplog.text


# -- server-side batching: concurrent predict calls gathered into shared runs --------------------------
JOIN_TIMEOUT_S = 30.0
NEVER_S = 120.0  # a window interval no test waits for: its windows close when full


class Scaled(tf.Module):  # type: ignore[misc]
    """y = x * version, under signatures that do or do not let calls be stacked along the first dimension."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = tf.Variable(factor)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def rows(self, x: Any) -> dict[str, Any]:
        return {"y": x * self.factor, "total": tf.reduce_sum(x, axis=1)}

    @tf.function(input_signature=[tf.TensorSpec([1, 2], tf.float32)])
    def fixed(self, x: Any) -> dict[str, Any]:
        return {"y": x * self.factor}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def summed(self, x: Any) -> dict[str, Any]:
        return {"y": x * self.factor, "sum": tf.reduce_sum(x)}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def flat(self, x: Any) -> dict[str, Any]:
        return {"flat": tf.reshape(x * self.factor, [-1])}  # declared [None], but two values per row

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def one_row(self, x: Any) -> dict[str, Any]:
        tf.debugging.assert_equal(tf.shape(x)[0], 1, message="one row at a time")
        return {"y": x * self.factor}

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def non_negative(self, x: Any) -> dict[str, Any]:
        tf.debugging.assert_non_negative(x, message="x must not be negative")
        return {"y": x * self.factor}


SCALED_SIGNATURES = ("rows", "fixed", "summed", "flat", "one_row", "non_negative")


@pytest.fixture(scope="module")
def scaled_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions 1 and 2 of a `Scaled` model (y = x * 1, y = x * 2), each with every signature."""
    root = tmp_path_factory.mktemp("scaled")
    for version in (1, 2):
        module = Scaled(float(version))
        tf.saved_model.save(module, str(root / str(version)),
                            signatures={key: getattr(module, key) for key in SCALED_SIGNATURES})
    return root


class Runs:
    """The `on_run` hook: how many calls each run of the signature served."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, calls: int) -> None:
        with self.lock:
            self.sizes.append(calls)


def gathering_client(tmp_path: Path, models: Path, signature_key: str, max_batch_size: int,
                     interval_s: float = NEVER_S) -> tuple[TensorFlowClient, Runs]:
    client = tf_client(tmp_path, models, signature_key=signature_key)
    client.manager.get(None, 2)  # loaded before the calls race, as a replica preloads its models
    client.manager.get(None, 1)
    runs = Runs()
    client.gather(max_batch_size, interval_s, on_run=runs)
    return client, runs


def call_together(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run `target(i)` on `count` threads started together; each result or exception, by index."""
    outcomes: list[Any] = [None] * count
    start = threading.Barrier(count)

    def body(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcomes[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a call is still waiting for its run"
    return outcomes


def rows_of(i: int, width: int = 2) -> np.ndarray:
    """Call i's input: i % 3 + 1 rows, every value different from every other call's."""
    count = i % 3 + 1
    return (1000 * i + np.arange(count * width, dtype=np.float32)).reshape(count, width)


def test_concurrent_calls_share_runs_and_each_gets_its_own_rows(tmp_path: Path, scaled_models: Path) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "rows", max_batch_size=4)

    outcomes = call_together(12, lambda i: client.predict(rows_of(i)))

    for i, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), outcome
        assert outcome["y"] == floats(rows_of(i) * 2)  # the latest version: y = x * 2
        assert outcome["total"] == floats(rows_of(i).sum(axis=1))
    assert runs.sizes == [4, 4, 4]  # three full windows of four calls, one run each


def test_a_call_of_another_trailing_shape_runs_in_its_own_group(tmp_path: Path, scaled_models: Path) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "rows", max_batch_size=4)
    width = [2, 2, 3, 2]  # call 2's rows are three wide: it cannot be stacked with the others

    outcomes = call_together(4, lambda i: client.predict({"x": rows_of(i, width[i])}))

    for i, outcome in enumerate(outcomes):
        assert outcome["y"] == floats(rows_of(i, width[i]) * 2)
    assert sorted(runs.sizes) == [1, 3]


def test_calls_for_different_versions_never_share_a_run(tmp_path: Path, scaled_models: Path) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "rows", max_batch_size=8)

    outcomes = call_together(8, lambda i: client.predict(rows_of(i), model_version=1 + i % 2))

    for i, outcome in enumerate(outcomes):
        assert outcome["y"] == floats(rows_of(i) * (1 + i % 2))
    assert runs.sizes == [4, 4]  # one window, one run per version


def test_a_signature_without_a_batch_dimension_runs_each_call_alone_at_once(
    tmp_path: Path, scaled_models: Path
) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "fixed", max_batch_size=4)

    # The window would close only when full, two minutes on: these calls never wait for one.
    outcomes = call_together(3, lambda i: client.predict([[i, i + 0.5]]))

    for i, outcome in enumerate(outcomes):
        assert outcome["y"] == floats([[2 * i, 2 * i + 1]])
    assert runs.sizes == [1, 1, 1]


def test_a_signature_with_an_output_of_no_batch_dimension_runs_each_call_alone(
    tmp_path: Path, scaled_models: Path
) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "summed", max_batch_size=3)

    outcomes = call_together(3, lambda i: client.predict(rows_of(i)))

    for i, outcome in enumerate(outcomes):
        assert outcome["sum"] == floats(rows_of(i).sum())  # the call's own sum, not the run's
    assert runs.sizes == [1, 1, 1]


def test_outputs_not_one_row_per_input_row_fall_back_to_one_call_per_run(
    tmp_path: Path, scaled_models: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "flat", max_batch_size=4)

    with caplog.at_level(logging.WARNING):
        outcomes = call_together(4, lambda i: client.predict(rows_of(i)))
        later = call_together(4, lambda i: client.predict(rows_of(i)))

    for outcome in (*outcomes, *later):
        assert not isinstance(outcome, BaseException), outcome
    for i, (first, second) in enumerate(zip(outcomes, later, strict=True)):
        assert first["flat"] == floats((rows_of(i) * 2).ravel())
        assert second["flat"] == floats((rows_of(i) * 2).ravel())
    # The shared run answered 2 values per row; each call was run again alone, and the model
    # version is not stacked any more (the later calls run alone at once).
    assert runs.sizes == [4, 1, 1, 1, 1, 1, 1, 1, 1]
    assert "output 'flat' did not have one row per input row" in caplog.text
    assert client.manager.get(None, "latest").model.stacking.possible is False


def test_a_graph_that_refuses_stacked_rows_falls_back_to_one_call_per_run(
    tmp_path: Path, scaled_models: Path
) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "one_row", max_batch_size=3)

    outcomes = call_together(3, lambda i: client.predict([[i, i]]))

    for i, outcome in enumerate(outcomes):
        assert outcome["y"] == floats([[2 * i, 2 * i]])
    assert runs.sizes == [3, 1, 1, 1]
    stacking = client.manager.get(None, "latest").model.stacking
    assert stacking.possible is False and "each call alone succeeded" in stacking.why_not


def test_values_the_model_rejects_fail_only_their_own_call(tmp_path: Path, scaled_models: Path) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "non_negative", max_batch_size=4)

    outcomes = call_together(4, lambda i: client.predict([[-1.0, 1.0]] if i == 2 else rows_of(i)))

    assert isinstance(outcomes[2], ModelInputError)
    assert "x must not be negative" in outcomes[2].message
    for i in (0, 1, 3):
        assert outcomes[i]["y"] == floats(rows_of(i) * 2)
    assert runs.sizes == [4, 1, 1, 1, 1]  # the shared run raised: each call was run alone
    assert client.manager.get(None, "latest").model.stacking.possible is True  # one call's values, not the model


def test_an_input_that_does_not_fit_fails_its_caller_without_joining_a_window(
    tmp_path: Path, scaled_models: Path
) -> None:
    client, runs = gathering_client(tmp_path, scaled_models, "non_negative", max_batch_size=3)

    # Four callers, a window of three: the window fills only if the bad call never joins it.
    outcomes = call_together(4, lambda i: client.predict([[1.0, 2.0, 3.0]] if i == 0 else rows_of(i)))

    assert isinstance(outcomes[0], ModelInputError)
    assert outcomes[0].message == "input 'x': expected shape [None, 2], got [1, 3] (dimension 1 must be 2, not 3)"
    for i in (1, 2, 3):
        assert outcomes[i]["y"] == floats(rows_of(i) * 2)
    assert runs.sizes == [3]


def test_a_call_past_its_requests_deadline_is_left_out_of_its_run(tmp_path: Path, scaled_models: Path) -> None:
    from foundation.errors import RequestTimeout
    from predictors_runtime.batching import request_deadline

    client, runs = gathering_client(tmp_path, scaled_models, "rows", max_batch_size=4, interval_s=0.01)
    token = request_deadline.set(time.time() - 1)
    try:
        with pytest.raises(RequestTimeout):
            client.predict(rows_of(0))
    finally:
        request_deadline.reset(token)
    assert runs.sizes == []


def test_a_tensorflow_predictor_with_server_side_batching_gets_one_payload_per_call(
    tmp_path: Path, scaled_models: Path
) -> None:
    """Cortex's contract: `predict` is unchanged under batching; the client's calls are gathered."""
    from predictors_runtime.config import ServerSideBatching
    from predictors_runtime.realtime_predictor import RealtimePredictor, RequestArgs

    client = tf_client(tmp_path, scaled_models, signature_key="rows")
    client.manager.get(None, "latest")
    runs = Runs()

    class TensorFlowPredictor:
        def __init__(self, tensorflow_client: TensorFlowClient) -> None:
            self.client = tensorflow_client

        def predict(self, payload: dict[str, Any]) -> list[float]:
            assert isinstance(payload, dict), payload
            return self.client.predict([payload["row"]])["y"]  # flat: the one row's two values

    predictor = RealtimePredictor(TensorFlowPredictor(client), client, predictor_type="tensorflow",
                                  batching=ServerSideBatching(max_batch_size=6, batch_interval=60),
                                  on_batch=runs)

    outcomes = call_together(6, lambda i: predictor.predict(RequestArgs(payload={"row": [i, -i]})))

    assert outcomes == [[2.0 * i, -2.0 * i] for i in range(6)]
    assert runs.sizes == [6]
    assert predictor.gathers_client_calls and not predictor.batched
