"""A TensorFlow model's outputs as Cortex's `tensorflow_client.predict` returned them: TensorFlow Serving's answer
through protobuf's JSON mapping, each output one flat list (`predictors_runtime/clients/tensorflow_outputs.py`).

The table is the one Cortex v0.25-v0.35 read in its serving library's `tfs` module (`DTYPE_TO_VALUE_KEY`, then
`json_format.MessageToDict`), with the dtypes it left out spelled by the same JSON rules."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from predictors_runtime.clients.tensorflow_outputs import cortex_outputs, cortex_values


@pytest.mark.parametrize(("values", "dtype", "expected"), [
    ([[0.1, 0.2], [1.5, -3.0]], np.float32, [0.1, 0.2, 1.5, -3.0]),  # float_val, shortest float32, rows flattened
    ([0.1, 1e300], np.float64, [0.1, 1e300]),  # double_val
    ([[1], [2]], np.int64, ["1", "2"]),  # int64_val: strings
    ([7, -8], np.int32, [7, -8]),  # int_val
    ([255], np.uint8, [255]),
    ([2**64 - 1], np.uint64, [str(2**64 - 1)]),
    ([True, False], np.bool_, [True, False]),
    ([b"hi", b""], object, ["aGk=", ""]),  # string_val: base64
    ([1.5], np.float16, [15872]),  # half_val: the bits
    ([1 + 2j], np.complex64, [1.0, 2.0]),  # scomplex_val: real, imaginary
    ([np.nan, np.inf, -np.inf], np.float32, ["NaN", "Infinity", "-Infinity"]),
    ([], np.float32, []),
])
def test_each_dtype_is_spelled_as_tensorflow_servings_json_spelled_it(values: Any, dtype: Any, expected: Any) -> None:
    assert cortex_values(np.array(values, dtype=dtype)) == expected


def test_a_cortex_iris_predictor_indexes_the_class_ids_as_its_authors_wrote_it() -> None:
    # examples of Cortex v0.30-v0.35: `int(prediction["class_ids"][0])`, with class_ids int64 of shape [1, 1]
    prediction = cortex_outputs({"class_ids": np.array([[2]], dtype=np.int64),
                                 "probabilities": np.array([[0.1, 0.2, 0.7]], dtype=np.float32)})

    assert int(prediction["class_ids"][0]) == 2
    assert prediction["probabilities"] == [0.1, 0.2, 0.7]
