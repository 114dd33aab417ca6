"""The `payload` a realtime predictor receives, by Content-Type, as Cortex's docs promise it."""

from __future__ import annotations

import io
import pickle

import pytest
from werkzeug.test import EnvironBuilder
from werkzeug.wrappers import Request

from foundation.errors import BadRequest
from predictors_runtime.payloads import FormPayload, UploadedFile, parse_payload


def request_with(**kwargs) -> Request:
    return EnvironBuilder(method="POST", path="/api", **kwargs).get_request()


def test_a_json_body_is_the_parsed_value():
    assert parse_payload(request_with(json={"key": "value", "n": [1, 2.5]})) == {"key": "value", "n": [1, 2.5]}


def test_any_plus_json_type_is_parsed_as_json():
    request = request_with(data=b'{"a": 1}', content_type="application/vnd.api+json")
    assert parse_payload(request) == {"a": 1}


def test_json_that_python_reads_but_orjson_refuses_still_parses():
    payload = parse_payload(request_with(data=b'{"x": NaN}', content_type="application/json"))
    assert payload["x"] != payload["x"]  # NaN


def test_invalid_json_is_a_bad_request_naming_the_parsers_complaint():
    with pytest.raises(BadRequest) as caught:
        parse_payload(request_with(data=b'{"key": ', content_type="application/json"))
    assert caught.value.http_status == 400
    assert "not valid JSON" in caught.value.message
    assert "line 1 column" in caught.value.message


def test_uploaded_files_read_as_in_cortexs_example():
    obj = {"key": "value"}
    request = request_with(data={
        "text": (io.BytesIO(b"hello text"), "text.txt", "text/plain"),
        "object": (io.BytesIO(pickle.dumps(obj)), "object.pkl"),
        "image": (io.BytesIO(b"\x89PNG..."), "image.png", "image/png"),
    })

    payload = parse_payload(request)

    assert isinstance(payload, FormPayload)
    assert payload["text"].file.read().decode("utf-8") == "hello text"
    assert pickle.load(payload["object"].file) == obj
    image = payload["image"]
    assert isinstance(image, UploadedFile)
    assert (image.filename, image.content_type) == ("image.png", "image/png")
    assert image.read() == b"\x89PNG..."


def test_a_multipart_form_mixes_text_fields_and_files():
    request = request_with(data={"name": "iris", "upload": (io.BytesIO(b"1,2,3"), "rows.csv")})
    payload = parse_payload(request)
    assert payload["name"] == "iris"
    assert payload["upload"].file.read() == b"1,2,3"


def test_a_url_encoded_form_is_a_mapping_of_strings():
    request = request_with(data="key=value&tag=a&tag=b", content_type="application/x-www-form-urlencoded")
    payload = parse_payload(request)
    assert payload["key"] == "value"
    assert payload.getlist("tag") == ["a", "b"]


def test_a_form_payload_is_read_only():
    payload = parse_payload(request_with(data="key=value", content_type="application/x-www-form-urlencoded"))
    with pytest.raises(TypeError):
        payload["key"] = "other"


def test_a_malformed_multipart_body_is_a_bad_request_not_an_empty_form():
    with pytest.raises(BadRequest) as caught:
        parse_payload(request_with(data=b"--x\r\n", content_type="multipart/form-data"))  # no boundary
    assert "multipart/form-data" in caught.value.message


def test_plain_text_is_decoded_as_utf8_by_default():
    assert parse_payload(request_with(data="héllo wörld".encode(), content_type="text/plain")) == "héllo wörld"


def test_plain_text_is_decoded_with_the_charset_it_names():
    request = request_with(data="café".encode("latin-1"), content_type="text/plain; charset=ISO-8859-1")
    assert parse_payload(request) == "café"


def test_plain_text_that_does_not_decode_is_a_bad_request():
    with pytest.raises(BadRequest) as caught:
        parse_payload(request_with(data=b"\xff\xfe\xfa", content_type="text/plain; charset=utf-8"))
    assert "utf-8" in caught.value.message


def test_an_unknown_charset_is_a_bad_request():
    with pytest.raises(BadRequest) as caught:
        parse_payload(request_with(data=b"hi", content_type="text/plain; charset=klingon"))
    assert "klingon" in caught.value.message


@pytest.mark.parametrize("content_type", ["application/octet-stream", "image/png", "application/x-custom"])
def test_other_content_types_give_the_raw_bytes(content_type):
    assert parse_payload(request_with(data=pickle.dumps({"k": 1}), content_type=content_type)) == pickle.dumps({"k": 1})


def test_no_content_type_gives_the_raw_bytes():
    request = request_with(data=b"\x00\x01binary")
    request.environ.pop("CONTENT_TYPE", None)
    assert parse_payload(request) == b"\x00\x01binary"


def test_a_form_payload_is_a_mapping_but_not_a_dict_as_cortexs_form_data_was():
    """Cortex predictors tell JSON objects from forms with `isinstance(payload, dict)`."""
    from collections.abc import Mapping

    form = parse_payload(request_with(data="key=value", content_type="application/x-www-form-urlencoded"))
    parsed_json = parse_payload(request_with(json={"key": "value"}))

    assert isinstance(form, Mapping) and not isinstance(form, dict)
    assert isinstance(parsed_json, dict)
    assert dict(form) == {"key": "value"} and list(form) == ["key"] and len(form) == 1
    assert "key" in form and "other" not in form and form.get("other") is None


def test_a_repeated_form_field_reads_as_starlette_read_it():
    request = request_with(data="tag=a&name=iris&tag=b&tag=c", content_type="application/x-www-form-urlencoded")

    payload = parse_payload(request)

    assert payload["tag"] == "c"  # the last value sent, as starlette's FormData answers
    assert payload.getlist("tag") == ["a", "b", "c"]
    assert payload.getlist("missing") == []
    assert sorted(payload.multi_items()) == [("name", "iris"), ("tag", "a"), ("tag", "b"), ("tag", "c")]
    assert dict(payload.items()) == {"tag": "c", "name": "iris"}


def test_closing_a_form_payload_closes_every_uploaded_file_even_repeated_ones():
    request = request_with(data={"upload": [(io.BytesIO(b"one"), "1.txt"), (io.BytesIO(b"two"), "2.txt")],
                                 "name": "rows"})
    payload = parse_payload(request)
    files = payload.getlist("upload")
    assert [f.filename for f in files] == ["1.txt", "2.txt"]

    payload.close()

    assert all(f.file.closed for f in files)
