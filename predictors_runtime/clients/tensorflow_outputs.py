"""A TensorFlow model's outputs as Cortex's `tensorflow_client.predict` returned them.

Cortex ran TensorFlow models in TensorFlow Serving and turned its gRPC answer into a dict with
protobuf's JSON mapping (`json_format.MessageToDict`, Cortex v0.25-v0.35, in the `tfs` module of
its serving library), keeping of each output tensor only its typed values field. So
each output came back as one flat list of its values, row after row, its shape dropped, and the
values spelled as protobuf's JSON spells them:

| dtype | TensorProto field | a value |
|---|---|---|
| float32 | `float_val` | a float, shortest for float32 (`0.1`, not `0.10000000149011612`) |
| float64 | `double_val` | a float |
| float16, bfloat16 | `half_val` | the value's 16 bits, as an int |
| int8, int16, int32, uint8, uint16 | `int_val` | an int |
| uint32 | `uint32_val` | an int |
| int64, uint64 | `int64_val`, `uint64_val` | a string of the number (JSON's 64-bit rule) |
| bool | `bool_val` | a bool |
| string | `string_val` | base64 text of the bytes |
| complex64, complex128 | `scomplex_val`, `dcomplex_val` | real and imaginary parts, in turn |

A float that is not finite is the string `NaN`, `Infinity` or `-Infinity`. Cortex failed (a 500)
for the dtypes its table left out and for an empty output; here those are lists like the others.
Predictors written for Cortex index these lists (`int(prediction["class_ids"][0])`); a predictor
that wants the arrays reshapes them, or asks the model itself (`tensorflow_client.get_model()`).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def cortex_outputs(outputs: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Output name -> its values as one flat list, spelled as Cortex's client gave them."""
    return {name: cortex_values(np.asarray(value)) for name, value in outputs.items()}


def cortex_values(array: np.ndarray[Any, Any]) -> list[Any]:
    """One output's values, flat and in order, as protobuf's JSON mapping spells them."""
    flat = array.reshape(-1)
    kind, size = flat.dtype.kind, flat.dtype.itemsize
    if kind == "b":
        return [bool(v) for v in flat]
    if kind == "i":
        return [str(int(v)) for v in flat] if size == 8 else [int(v) for v in flat]
    if kind == "u":
        return [str(int(v)) for v in flat] if size == 8 else [int(v) for v in flat]
    if kind == "f" and size == 2:
        return [int(v) for v in flat.view(np.uint16)]
    if kind == "V" and size == 2:  # bfloat16, where numpy has no name for it
        return [int(v) for v in flat.view(np.uint16)]
    if kind == "f":
        return _floats(flat)
    if kind == "c":
        return _floats(np.stack([flat.real, flat.imag], axis=-1).reshape(-1))
    if kind in ("S", "O", "U"):
        return [base64.b64encode(v if isinstance(v, bytes) else str(v).encode()).decode() for v in flat]
    raise TypeError(f"an output of dtype {flat.dtype} has no TensorFlow Serving value field")


def _floats(flat: np.ndarray[Any, Any]) -> list[Any]:
    """Floats as protobuf's JSON writes them: a float32 with the fewest digits that read back as the same
    float32 (numpy's `str` of one), a float64 as Python's; a value that is not finite as a string."""
    values: list[Any] = [float(str(v)) for v in flat] if flat.dtype.itemsize == 4 else flat.tolist()
    if not np.isfinite(flat).all():
        values = [_not_finite(v) if not math.isfinite(v) else v for v in values]
    return values


def _not_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"
