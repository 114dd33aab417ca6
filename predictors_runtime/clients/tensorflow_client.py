"""`tensorflow_client`: runs SavedModels in-process with TensorFlow, one signature per client.

Cortex sent inputs to a TensorFlow Serving container; Sluice calls the SavedModel's signature
function directly and answers as TF Serving did, a dict of output name -> values. The signature
is `models.signature_key`, else `serving_default`, else the model's only one.

With `gather(...)` (a realtime API's `server_side_batching`), concurrent `predict` calls are
gathered into shared runs of the signature, each call getting its own rows back
(`tensorflow_batching.py`): the predictor stays Cortex's, one payload per `predict`.

tensorflow is imported when the first model is loaded, never when this module is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foundation.errors import ConfigError, ModelInputError
from predictors_runtime.batching import DEFAULT_MAX_WAIT_S

from .hardware import tensorflow_device
from .onnx_client import InputSpec, prepare_inputs
from .python_client import ManagerFactory, ModelClient
from .tensorflow_batching import CallGatherer, Outputs, Stacking, signature_stacking
from .tensorflow_outputs import cortex_outputs

DEFAULT_SIGNATURE_KEY = "serving_default"


def pick_signature(signatures: Any, signature_key: str | None, where: str) -> str:
    """The key of the signature to serve from a SavedModel's `signatures` mapping."""
    keys: list[str] = sorted(signatures.keys())
    if signature_key is not None:
        if signature_key not in keys:
            raise ConfigError(
                f"{where}: signature_key {signature_key!r} is not a signature of the SavedModel; "
                f"its signatures are: {', '.join(keys) if keys else 'none'}"
            )
        return signature_key
    if DEFAULT_SIGNATURE_KEY in keys:
        return DEFAULT_SIGNATURE_KEY
    if len(keys) == 1:
        return keys[0]
    if not keys:
        raise ConfigError(f"{where}: the SavedModel has no signatures; save it with signatures=...")
    raise ConfigError(
        f"{where}: the SavedModel has several signatures and none is {DEFAULT_SIGNATURE_KEY}; "
        f"set predictor.models.signature_key to one of: {', '.join(keys)}"
    )


def _input_spec(name: str, tensor_spec: Any) -> InputSpec:
    """An `InputSpec` from a `tf.TensorSpec` of a signature's inputs."""
    shape = None if tensor_spec.shape.rank is None else tuple(tensor_spec.shape.as_list())
    try:
        dtype: np.dtype[Any] | None = np.dtype(tensor_spec.dtype.as_numpy_dtype)
    except TypeError:  # resource and variant tensors have no numpy equivalent
        dtype = None
    type_name = dtype.name if dtype is not None else tensor_spec.dtype.name
    return InputSpec(name=name, shape=shape, dtype=dtype, type_name=type_name)


def _output_shapes(signature: Any) -> dict[str, tuple[int | None, ...] | None]:
    """Output name -> declared shape (None where the rank is unknown) of a signature's ConcreteFunction."""
    outputs = signature.structured_outputs
    if not isinstance(outputs, dict):  # a signature answers a dict; anything else is checked per run
        return {}
    return {name: None if spec.shape.rank is None else tuple(spec.shape.as_list()) for name, spec in outputs.items()}


@dataclass(frozen=True)
class TensorFlowModel:
    """One loaded SavedModel version with the signature this client serves."""

    loaded: Any  # what tf.saved_model.load returned
    signature_key: str
    signature: Any  # the signature's ConcreteFunction
    inputs: tuple[InputSpec, ...]
    input_dtypes: dict[str, Any]  # input name -> tf.DType
    device: str
    source: str  # the version's local folder, to name it in log lines
    stacking: Stacking  # whether concurrent calls may share a run (server-side batching)


def run_signature(model: TensorFlowModel, feed: dict[str, Any]) -> Outputs:
    """Run the model's signature on checked inputs; `ModelInputError` when the model rejects them."""
    import tensorflow as tf  # type: ignore[import-untyped,unused-ignore]

    try:
        with tf.device(model.device):
            tensors = {name: tf.constant(value, dtype=model.input_dtypes[name]) for name, value in feed.items()}
            outputs = model.signature(**tensors)
    except tf.errors.InvalidArgumentError as e:
        raise ModelInputError(f"the model rejected its input: {e.message}") from e
    return {name: value.numpy() for name, value in outputs.items()}


class TensorFlowClient(ModelClient):
    """`tensorflow_client`: `predict()` runs the chosen signature of a SavedModel.

    With `gpu`, models are loaded and run on "/GPU:0" when TensorFlow sees a GPU (with memory
    growth on, so several worker processes can share it), else on the CPU with a warning.
    """

    def __init__(self, manager_factory: ManagerFactory, signature_key: str | None = None, gpu: bool = False) -> None:
        super().__init__(manager_factory)
        self._signature_key = signature_key
        self._gpu = gpu
        self._device: str | None = None
        self._gatherer: CallGatherer | None = None

    def gather(self, max_batch_size: int, interval_s: float, *, max_wait_s: float = DEFAULT_MAX_WAIT_S,
               on_run: Callable[[int], None] | None = None) -> None:
        """From now on, gather concurrent `predict` calls into shared runs (`server_side_batching`).

        A window opens with a call and closes at `max_batch_size` calls or `interval_s` after it
        opened; `on_run(calls)` is told how many calls each run of a signature served. Set by
        the realtime replica, so a batch job's calls (one thread) never wait for a window.
        """
        self._gatherer = CallGatherer(run_signature, max_batch_size, interval_s, max_wait_s=max_wait_s, on_run=on_run)

    def _pick_device(self) -> str:
        if self._device is None:
            import tensorflow as tf  # type: ignore[import-untyped,unused-ignore]

            gpus = tf.config.list_physical_devices("GPU") if self._gpu else []
            for gpu in gpus:
                with contextlib.suppress(RuntimeError, ValueError):  # already initialised: keep its setting
                    tf.config.experimental.set_memory_growth(gpu, True)
            self._device = tensorflow_device(self._gpu, available=gpus)
        return self._device

    def _load(self, path: Path) -> TensorFlowModel:
        import tensorflow as tf  # type: ignore[import-untyped,unused-ignore]

        device = self._pick_device()
        # A bad export raises here; the manager reports it with the model's name and version.
        with tf.device(device):
            loaded = tf.saved_model.load(str(path))
        key = pick_signature(loaded.signatures, self._signature_key, str(path))
        signature = loaded.signatures[key]
        _, kwargs = signature.structured_input_signature
        inputs = tuple(_input_spec(name, spec) for name, spec in sorted(kwargs.items()))
        dtypes = {name: spec.dtype for name, spec in kwargs.items()}
        return TensorFlowModel(loaded, key, signature, inputs, dtypes, device, str(path),
                               signature_stacking(inputs, _output_shapes(signature)))

    def get_model(self, model_name: str | None = None, model_version: str | int = "latest") -> dict[str, Any]:
        """The model version as `{"model", "signature", "signature_key", "input_signatures"}`.

        `model` is what `tf.saved_model.load` returned, `signature` the served signature's
        function, `input_signatures` `{name: {"shape": [None, 2], "type": "float32"}}`.
        """
        model: TensorFlowModel = self._loaded(model_name, model_version).model
        return {
            "model": model.loaded,
            "signature": model.signature,
            "signature_key": model.signature_key,
            "input_signatures": {spec.name: spec.describe() for spec in model.inputs},
        }

    def predict(
        self, model_input: Any, model_name: str | None = None, model_version: str | int = "latest"
    ) -> dict[str, list[Any]]:
        """Run the signature on `model_input`; returns output name -> its values as Cortex's client gave
        them: one flat list each, spelled as TensorFlow Serving's JSON (`tensorflow_outputs.py`).

        `model_input` is a dict of input name -> array-like, or one array-like for a signature
        with a single input; values are converted to each input's dtype and checked against its
        shape. Raises `ModelInputError` for an input that does not fit.

        When gathering, the inputs are checked here, on the caller's thread, before the call
        joins a window: a call that does not fit fails alone and never joins a shared run.
        """
        model: TensorFlowModel = self._loaded(model_name, model_version).model
        feed = prepare_inputs(model_input, model.inputs)
        gatherer = self._gatherer
        outputs = run_signature(model, feed) if gatherer is None else gatherer.predict(model, feed)
        return cortex_outputs(outputs)
