"""Turning what a realtime predictor's `predict` returned into an HTTP response, as Cortex did.

- a JSON-serialisable value (numpy scalars and arrays included, at any depth) -> JSON;
- str -> `text/plain; charset=utf-8`; bytes -> `application/octet-stream`;
- a Flask/werkzeug `Response` -> sent as it is;
- a starlette `Response` (Cortex's own type) -> converted: body, status, headers, media type;
- anything else -> `PredictorError` (500) naming the type.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from werkzeug.datastructures import Headers
from werkzeug.wrappers import Response

from foundation.errors import PredictorError

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"
BYTES_TYPE = "application/octet-stream"

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def _numpy_leftovers(value: Any) -> Any:
    """What orjson hands back: arrays it cannot take whole (not C-contiguous, odd dtypes), numpy scalars."""
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, without importing numpy
    if tolist is not None and type(value).__module__ == "numpy":
        return tolist()
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def dumps(value: Any) -> bytes:
    """JSON bytes of a value; numpy values become plain numbers and lists. Raises TypeError."""
    return orjson.dumps(value, default=_numpy_leftovers, option=_JSON_OPTIONS)


def json_response(body: Any, status: int = 200) -> Response:
    """A JSON response of a value Sluice itself made (error bodies, readiness)."""
    return Response(dumps(body), status=status, content_type=JSON_TYPE)


def _from_starlette(value: Any) -> Response | None:
    """A werkzeug copy of a starlette Response, or None when `value` is not one.

    starlette is imported only for values of its own modules, so Sluice needs it only where the
    predictors use it.
    """
    if not type(value).__module__.startswith("starlette"):
        return None
    try:
        from starlette.responses import Response as StarletteResponse
    except ImportError:
        return None
    if not isinstance(value, StarletteResponse):
        return None
    headers = Headers(
        [(k.decode("latin-1"), v.decode("latin-1")) for k, v in value.raw_headers
         if k.lower() not in (b"content-length", b"transfer-encoding")]
    )
    if hasattr(value, "body"):
        body = value.body
    elif hasattr(value, "body_iterator"):  # StreamingResponse: gather what it streams
        body = asyncio.run(_gather(value.body_iterator, value.charset))
    elif hasattr(value, "path"):  # FileResponse
        with open(value.path, "rb") as file:
            body = file.read()
    else:
        raise PredictorError(f"predict returned a starlette {type(value).__name__}, which Sluice cannot send")
    response = Response(bytes(body), status=value.status_code, headers=headers)
    media_type: str | None = getattr(value, "media_type", None)
    if "content-type" not in headers and media_type:
        response.content_type = media_type
    return response


async def _gather(iterator: Any, charset: str) -> bytes:
    parts = []
    async for chunk in iterator:
        parts.append(chunk.encode(charset) if isinstance(chunk, str) else bytes(chunk))
    return b"".join(parts)


def to_response(value: Any) -> Response:
    """The HTTP response for a value `predict` returned (see the module docstring)."""
    kind = type(value)
    if kind is not dict and kind is not list:  # the common case skips these checks
        if isinstance(value, str):
            try:
                return Response(value.encode("utf-8"), content_type=TEXT_TYPE)
            except UnicodeEncodeError as e:
                raise PredictorError(f"predict returned a str that is not valid text: {e}") from e
        if isinstance(value, (bytes, bytearray, memoryview)):
            return Response(bytes(value), content_type=BYTES_TYPE)
        if isinstance(value, Response):
            return value
    try:
        return Response(dumps(value), content_type=JSON_TYPE)
    except TypeError as e:
        converted = _from_starlette(value)
        if converted is not None:
            return converted
        name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise PredictorError(
            f"predict returned a {name}, which Sluice cannot send as a response ({e}); return a "
            "JSON-serialisable value, str, bytes or a Response"
        ) from e
