"""`onnx_client`: runs ONNX models in-process with onnxruntime, and checks inputs before it does.

A model version is loaded into one `onnxruntime.InferenceSession` with its input and output
signatures worked out once. `predict` turns the caller's values into arrays of the dtypes and
shapes the model declares, so a wrong input fails with a message naming the input, what it
should be and what was given, instead of an onnxruntime error deep in the graph.

The input checks (`InputSpec`, `prepare_inputs`) are shared with the TensorFlow client.
onnxruntime is imported when the first model is loaded, never when this module is imported.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from foundation.errors import ConfigError, ModelInputError

from .hardware import CUDA_PROVIDER, cpu_threads, onnx_providers
from .python_client import ManagerFactory, ModelClient

logger = logging.getLogger(__name__)

# The element types of ONNX tensors that have a numpy equivalent.
ONNX_TO_NUMPY: dict[str, type] = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


# -- input checks, shared by the ONNX and TensorFlow clients -------------------------------------
@dataclass(frozen=True)
class InputSpec:
    """One model input as the checks see it.

    `shape` has None for a dimension of any size, and is None itself when any rank is allowed;
    `dtype` is None for an input whose values are passed on unchanged (a non-tensor ONNX input).
    """

    name: str
    shape: tuple[int | None, ...] | None
    dtype: np.dtype[Any] | None
    type_name: str  # as `input_signatures` reports it: a numpy dtype name, or the runtime's own

    def describe(self) -> dict[str, Any]:
        """`{"shape": [...], "type": "float32"}`, an entry of a client's `input_signatures`."""
        return {"shape": None if self.shape is None else list(self.shape), "type": self.type_name}


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("None" if d is None else str(d) for d in shape) + "]"


def _values_word(spec: InputSpec) -> str:
    """How a message names the values an input takes: "float32", "string", ..."""
    if spec.dtype is not None and spec.dtype.kind == "O":
        return "string"
    return spec.type_name


def prepare_inputs(model_input: Any, specs: Sequence[InputSpec]) -> dict[str, Any]:
    """Input name -> array of the declared dtype, checked against the declared shape.

    `model_input` is a mapping of input name -> array-like, or, for a model with a single input,
    that input's array-like alone. Raises `ModelInputError` for unknown or missing names, a bare
    value for a model with several inputs, a wrong rank or dimension, and values that cannot be
    converted to the input's dtype.
    """
    names = [spec.name for spec in specs]
    listed = ", ".join(names) if names else "none"
    if isinstance(model_input, Mapping):
        given = dict(model_input)
        unknown = [key for key in given if key not in names]
        missing = [name for name in names if name not in given]
        if unknown or missing:
            parts = []
            if unknown:
                parts.append("unknown input" + ("s " if len(unknown) > 1 else " ") + ", ".join(map(repr, unknown)))
            if missing:
                parts.append("missing input" + ("s " if len(missing) > 1 else " ") + ", ".join(map(repr, missing)))
            raise ModelInputError(f"{'; '.join(parts)} (the model's inputs are: {listed})")
    elif len(specs) == 1:
        given = {specs[0].name: model_input}
    else:
        raise ModelInputError(
            f"the model has {len(specs)} inputs ({listed}); pass model_input as a dict of input name "
            f"-> values, not a bare {type(model_input).__name__}"
        )
    return {spec.name: conform_input(spec, given[spec.name]) for spec in specs}


def conform_input(spec: InputSpec, value: Any) -> Any:
    """`value` as an array of the input's dtype and shape, or a `ModelInputError` naming the input."""
    if spec.dtype is None:
        return value
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as e:  # ragged nested lists, objects numpy cannot hold
        raise ModelInputError(
            f"input {spec.name!r}: expected {_values_word(spec)} values of shape {_shape_text(spec.shape or ())}, "
            f"got values that do not form an array ({e})"
        ) from e
    array = _batch_of_one(spec, array)
    _check_shape(spec, array)
    return _cast(spec, array)


def _batch_of_one(spec: InputSpec, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """One sample given without its batch dimension, as a batch of one; anything else unchanged.

    Cortex's clients reshaped an input to the declared shape, so the predictors of its documents
    pass one flower as a flat list (`[5.1, 3.5, 1.4, 0.2]`) to a model declared `[None, 4]` or
    `[1, 4]`, and a scalar to a `[None]` input. Only that case is taken: the leading dimension
    unknown or 1, every other dimension matching; other shapes are still refused by name.
    """
    shape = spec.shape
    if not shape or array.ndim != len(shape) - 1 or shape[0] not in (None, 1):
        return array
    if any(expected is not None and expected != actual
           for expected, actual in zip(shape[1:], array.shape, strict=False)):
        return array
    return array[np.newaxis, ...]


def _check_shape(spec: InputSpec, array: np.ndarray[Any, Any]) -> None:
    if spec.shape is None:
        return
    if array.ndim != len(spec.shape):
        # (a single sample one dimension short that fits was made a batch of one before this)
        raise ModelInputError(
            f"input {spec.name!r}: expected {len(spec.shape)} dimensions (shape {_shape_text(spec.shape)}), "
            f"got {array.ndim} (shape {_shape_text(array.shape)})"
        )
    for axis, (expected, actual) in enumerate(zip(spec.shape, array.shape, strict=False)):
        if expected is not None and expected != actual:
            raise ModelInputError(
                f"input {spec.name!r}: expected shape {_shape_text(spec.shape)}, got {_shape_text(array.shape)} "
                f"(dimension {axis} must be {expected}, not {actual})"
            )


def _cast(spec: InputSpec, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:  # noqa: C901 - one rule per dtype family
    """Convert to the input's dtype, refusing conversions that would change values silently."""
    target = spec.dtype
    assert target is not None
    source = array.dtype
    if source == target:
        return array

    def refuse(why: str) -> ModelInputError:
        return ModelInputError(f"input {spec.name!r}: expected {_values_word(spec)} values, got {why}")

    if target.kind == "O":  # strings
        if source.kind in "US":
            return array.astype(object)
        if source.kind == "O" and all(isinstance(v, (str, bytes)) for v in array.flat):
            return array
        raise refuse(f"{source.name} values")
    if target.kind == "b":
        if source.kind in "iuf" and bool(np.isin(array, (0, 1)).all()):
            return array.astype(bool)
        raise refuse(f"{source.name} values (booleans are true/false, or 0/1)")
    if target.kind in "iuf":
        if source.kind in "OUS":  # text or Python objects: read them as numbers first
            try:
                array = array.astype(np.float64)
            except (ValueError, TypeError, OverflowError) as e:
                raise refuse(f"values that are not numbers ({e})") from e
        elif source.kind not in "biuf":
            raise refuse(f"{source.name} values")
        if target.kind in "iu" and array.size:
            whole = array.dtype.kind != "f" or (
                bool(np.isfinite(array).all()) and not bool((array != np.floor(array)).any())
            )
            if not whole:
                raise refuse("numbers that are not whole (an integer input takes whole numbers)")
            info = np.iinfo(target)
            low, high = array.min(), array.max()
            if low < info.min or high > info.max:
                raise refuse(f"numbers out of its range [{info.min}, {info.max}] (from {low} to {high})")
        with np.errstate(over="ignore", invalid="ignore"):
            converted = array.astype(target)
            # A finite sum means no element became infinite; only then is the exact check skipped.
            overflowed = (
                target.kind == "f"
                and not np.isfinite(converted.sum())
                and bool((np.isinf(converted) & np.isfinite(array)).any())
            )
        if overflowed:
            raise refuse(f"numbers too large for {target.name}")
        return converted
    try:
        return array.astype(target)
    except (ValueError, TypeError, OverflowError) as e:
        raise refuse(f"{source.name} values that cannot be converted ({e})") from e


# -- the ONNX client -----------------------------------------------------------------------------
def onnx_file(folder: Path) -> Path:
    """The one `*.onnx` file at the top of a model version's folder."""
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(".onnx"))
    if len(found) != 1:
        listed = f" ({', '.join(p.name for p in found)})" if found else ""
        raise ConfigError(f"{folder}: an ONNX model needs exactly one *.onnx file, found {len(found)}{listed}")
    return found[0]


def _numpy_name(onnx_type: str) -> str:
    dtype = ONNX_TO_NUMPY.get(onnx_type)
    return np.dtype(dtype).name if dtype is not None else onnx_type


def _node_arg(arg: Any) -> dict[str, Any]:
    """A session input or output as `{"shape": [...], "type": ..., "onnx_type": ...}`.

    `shape` is as onnxruntime reports it: ints, names of symbolic dimensions, or None;
    `type` is the numpy dtype name for tensors that have one, else the ONNX type.
    """
    shape = None if arg.shape is None else list(arg.shape)
    return {"shape": shape, "type": _numpy_name(arg.type), "onnx_type": arg.type}


def _input_spec(arg: Any) -> InputSpec:
    dtype = ONNX_TO_NUMPY.get(arg.type)
    shape = None
    # onnxruntime reports [] both for a scalar and for an input declared without a shape, so
    # [] is treated as "any rank" (onnxruntime still rejects a non-scalar for a true scalar).
    if arg.shape:
        shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in arg.shape)
    return InputSpec(
        name=arg.name, shape=shape, dtype=None if dtype is None else np.dtype(dtype), type_name=_numpy_name(arg.type)
    )


@dataclass(frozen=True)
class OnnxModel:
    """One loaded ONNX model version: its session and signatures, worked out at load time."""

    session: Any  # onnxruntime.InferenceSession
    signatures: dict[str, dict[str, dict[str, Any]]]
    inputs: tuple[InputSpec, ...]


class ONNXClient(ModelClient):
    """`onnx_client`: `predict()` runs a model, `get_model()` gives its session and signatures.

    With `gpu`, sessions use the CUDA provider when onnxruntime has it, else the CPU (with a
    warning).
    """

    def __init__(self, manager_factory: ManagerFactory, gpu: bool = False) -> None:
        super().__init__(manager_factory)
        self._gpu = gpu
        self._providers: list[str] | None = None
        self._threads = cpu_threads()

    def _load(self, path: Path) -> OnnxModel:
        import onnxruntime  # type: ignore[import-untyped,unused-ignore]

        file = onnx_file(path)
        if self._providers is None:
            self._providers = onnx_providers(self._gpu, onnxruntime.get_available_providers())
        # A file onnxruntime cannot load raises here; the manager reports it with the model's name.
        options = onnxruntime.SessionOptions()
        if self._threads is not None:
            options.intra_op_num_threads = self._threads
        session = onnxruntime.InferenceSession(str(file), sess_options=options, providers=self._providers)
        in_use = session.get_providers()
        if CUDA_PROVIDER in self._providers and CUDA_PROVIDER not in in_use:
            logger.warning("%s: onnxruntime could not use CUDA for this model; running on CPU", file)
        # Where the model really runs, in the node's log: what an operator checks on a GPU host.
        logger.info("%s: loaded with onnxruntime providers %s", file, ", ".join(in_use))
        signatures = {
            "inputs": {arg.name: _node_arg(arg) for arg in session.get_inputs()},
            "outputs": {arg.name: _node_arg(arg) for arg in session.get_outputs()},
        }
        return OnnxModel(session, signatures, tuple(_input_spec(arg) for arg in session.get_inputs()))

    def get_model(self, model_name: str | None = None, model_version: str | int = "latest") -> dict[str, Any]:
        """The model version as `{"session", "signatures", "input_signatures"}`.

        - `session`: its `onnxruntime.InferenceSession`;
        - `signatures`: `{"inputs": {name: arg}, "outputs": {name: arg}}`, each arg
          `{"shape": [...], "type": "float32", "onnx_type": "tensor(float)"}`, the shape as
          onnxruntime reports it (symbolic dimensions by name);
        - `input_signatures`: `{name: {"shape": [...], "type": "float32"}}`, what `predict`
          checks inputs against: None for a dimension of any size, the numpy dtype name.
        """
        model: OnnxModel = self._loaded(model_name, model_version).model
        return {
            "session": model.session,
            "signatures": copy.deepcopy(model.signatures),
            "input_signatures": {spec.name: spec.describe() for spec in model.inputs},
        }

    def predict(self, model_input: Any, model_name: str | None = None,
                model_version: str | int = "latest") -> list[Any]:
        """Run the model on `model_input` and return its outputs, as onnxruntime does.

        `model_input` is a dict of input name -> array-like, or one array-like for a model with a
        single input; values are converted to each input's dtype (a list of ints feeds a float
        input) and checked against its shape. Returns a list with one entry per model output, in
        the order of `signatures["outputs"]` (numpy arrays for tensor outputs). Raises
        `ModelInputError` for an input that does not fit.
        """
        model: OnnxModel = self._loaded(model_name, model_version).model
        feed = prepare_inputs(model_input, model.inputs)
        from onnxruntime.capi.onnxruntime_pybind11_state import (  # type: ignore[import-untyped,unused-ignore]
            InvalidArgument,
        )

        try:
            return list(model.session.run(None, feed))
        except InvalidArgument as e:
            raise ModelInputError(f"the model rejected its input: {e}") from e
