"""What `predict` returns becomes the HTTP answer Cortex would have sent."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flask import Response as FlaskResponse
from werkzeug.wrappers import Response

from foundation.errors import PredictorError
from predictors_runtime.responses import to_response


def body(response: Response):
    return json.loads(response.get_data())


@pytest.mark.parametrize("value", [{"class": "setosa", "p": 0.9}, [1, 2, 3], 42, 1.5, True, None, ("a", 1)])
def test_json_serialisable_values_are_sent_as_json(value):
    response = to_response(value)
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert body(response) == json.loads(json.dumps(value))


def test_numpy_scalars_and_arrays_are_sent_as_plain_json_at_any_depth():
    value = {
        "label": np.int64(2),
        "score": np.float32(0.5),
        "probabilities": np.array([[0.25, 0.75]], dtype=np.float64),
        "nested": [{"ok": np.bool_(True), "ids": np.arange(3, dtype=np.int32)}],
        3: "an integer key",
    }
    assert body(to_response(value)) == {
        "label": 2, "score": 0.5, "probabilities": [[0.25, 0.75]],
        "nested": [{"ok": True, "ids": [0, 1, 2]}], "3": "an integer key",
    }


def test_numpy_arrays_orjson_cannot_take_whole_are_still_sent():
    strided = np.arange(6).reshape(2, 3)[:, ::2]  # not C-contiguous
    assert body(to_response({"a": strided, "s": np.array(["x", "y"]), "f": np.float16(1.5)})) == {
        "a": [[0, 2], [3, 5]], "s": ["x", "y"], "f": 1.5,
    }


def test_a_top_level_numpy_array_is_sent_as_json():
    assert body(to_response(np.array([1.0, 2.0]))) == [1.0, 2.0]


def test_a_string_is_sent_as_utf8_text():
    response = to_response("class 1 ✓")
    assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert response.get_data() == "class 1 ✓".encode()


def test_bytes_are_sent_as_an_octet_stream():
    response = to_response(bytes(4))
    assert response.headers["Content-Type"] == "application/octet-stream"
    assert response.get_data() == b"\x00\x00\x00\x00"
    assert to_response(bytearray(b"ab")).get_data() == b"ab"


def test_a_werkzeug_or_flask_response_is_sent_as_it_is():
    own = Response("created", status=201, headers={"X-Own": "1"}, mimetype="text/csv")
    assert to_response(own) is own
    flask_response = FlaskResponse("{}", status=202)
    assert to_response(flask_response) is flask_response


@pytest.mark.parametrize("value, named", [({1, 2}, "set"), (object(), "object"), ({"a": {1}}, "set")])
def test_anything_else_is_a_predictor_error_naming_the_type(value, named):
    with pytest.raises(PredictorError) as caught:
        to_response(value)
    assert caught.value.http_status == 500
    assert named in caught.value.message


def test_a_string_that_cannot_be_encoded_is_a_predictor_error():
    with pytest.raises(PredictorError):
        to_response("lone surrogate \udc80")


def test_a_starlette_response_is_converted_with_its_body_status_headers_and_media_type():
    from starlette import responses  # declared in requirements-dev.txt
    original = responses.Response(b"\x89PNG", status_code=201, headers={"X-Model": "v2"}, media_type="image/png")

    response = to_response(original)

    assert response.status_code == 201
    assert response.get_data() == b"\x89PNG"
    assert response.headers["X-Model"] == "v2"
    assert response.headers["Content-Type"] == "image/png"
    assert response.headers["Content-Length"] == "4"


def test_starlettes_json_and_text_responses_are_converted():
    from starlette import responses
    converted = to_response(responses.JSONResponse({"a": 1}, status_code=418))
    assert (converted.status_code, converted.mimetype, body(converted)) == (418, "application/json", {"a": 1})
    text = to_response(responses.PlainTextResponse("hi"))
    assert (text.mimetype, text.get_data()) == ("text/plain", b"hi")


def test_a_starlette_streaming_response_is_gathered():
    from starlette import responses

    def rows():
        yield "a,b\n"
        yield b"1,2\n"

    converted = to_response(responses.StreamingResponse(rows(), media_type="text/csv"))
    assert converted.get_data() == b"a,b\n1,2\n"
    assert converted.mimetype == "text/csv"
