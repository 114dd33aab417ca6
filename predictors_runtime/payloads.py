"""The `payload` a realtime predictor receives, chosen by the request's Content-Type as Cortex did.

- `application/json` and any `+json` type: the parsed value.
- `multipart/form-data` and `application/x-www-form-urlencoded`: a read-only mapping
  (`FormPayload`) of strings and uploaded files (`UploadedFile`: `.file`, `.filename`,
  `.content_type`, `.read()`), so Cortex's `payload["image"].file.read()` and
  `pickle.load(payload["object"].file)` work unchanged. Like starlette's `FormData`, which
  Cortex handed over, it is a `Mapping` but not a `dict`: predictors that tell JSON objects
  from forms with `isinstance(payload, dict)` keep working.
- `text/plain`: a str decoded with the request's charset (utf-8 unless it says otherwise).
- anything else, or no Content-Type: the body's bytes.

A body that does not parse as its Content-Type says is the client's mistake: `BadRequest` (400)
naming the parser's complaint. Parsing happens only when the predictor declares `payload`, so an
API that never reads the body never pays for it.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import orjson
from werkzeug.datastructures import FileStorage
from werkzeug.wrappers import Request

from foundation.errors import BadRequest

FORM_TYPES = frozenset({"multipart/form-data", "application/x-www-form-urlencoded"})


class UploadedFile(FileStorage):
    """One uploaded file of a form payload; `.file` is its binary file object (Cortex's `UploadFile.file`)."""

    @property
    def file(self) -> IO[bytes]:
        return self.stream

    @classmethod
    def of(cls, storage: FileStorage) -> UploadedFile:
        return cls(stream=storage.stream, filename=storage.filename, name=storage.name, headers=storage.headers)


class FormPayload(Mapping[str, Any]):
    """A form's fields (str) and files (`UploadedFile`) by name; read-only, as starlette's `FormData`.

    Not a `dict` (werkzeug's multi-dicts are), because Cortex predictors tell a JSON object from
    a form with `isinstance(payload, dict)`. The semantics follow starlette's, which Cortex
    served: `payload[name]` is the last value sent under that name, `getlist(name)` all of them
    in the order sent, `multi_items()` every (name, value) pair (text fields before files, each
    name's values in the order sent).
    """

    __slots__ = ("_items", "_last")

    def __init__(self, items: Iterable[tuple[str, Any]] = ()) -> None:
        self._items: tuple[tuple[str, Any], ...] = tuple(items)
        self._last: dict[str, Any] = dict(self._items)

    def __getitem__(self, name: str) -> Any:
        return self._last[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._last)

    def __len__(self) -> int:
        return len(self._last)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self._items)!r})"

    def getlist(self, name: str) -> list[Any]:
        """Every value sent under `name`, in the order sent (empty when none was)."""
        return [value for key, value in self._items if key == name]

    def multi_items(self) -> list[tuple[str, Any]]:
        """Every (name, value) pair, repeated names included."""
        return list(self._items)

    def close(self) -> None:
        """Close the uploaded files (the temporary files of large uploads go with them)."""
        for _, value in self._items:
            if isinstance(value, UploadedFile):
                value.close()


def parse_json(body: bytes) -> Any:
    """Parse a JSON body; orjson first (fast), the standard library for what orjson refuses.

    The fallback accepts what Python's `json` does (NaN, UTF-16/32 bodies), so every body that
    Cortex's server parsed still parses. Note that orjson reads integers beyond 64 bits as floats.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the payload is not valid JSON: {e}") from e


def parse_form(request: Request) -> FormPayload:
    """Parse a multipart or url-encoded body strictly: a malformed one is a 400, not an empty form."""
    parser = request.make_form_data_parser()
    parser.silent = False
    try:
        _, form, files = parser.parse(request.stream, request.mimetype, request.content_length,
                                      request.mimetype_params)
    except ValueError as e:
        raise BadRequest(f"the payload is not valid {request.mimetype}: {e}") from e
    items: list[tuple[str, Any]] = list(form.items(multi=True))
    items.extend((name, UploadedFile.of(storage)) for name, storage in files.items(multi=True))
    return FormPayload(items)


def parse_text(body: bytes, charset: str) -> str:
    """Decode a text/plain body; an unknown charset or bytes it cannot decode are a 400."""
    try:
        codecs.lookup(charset)
    except LookupError as e:
        raise BadRequest(f"unknown charset {charset!r} in the Content-Type") from e
    try:
        return body.decode(charset)
    except UnicodeDecodeError as e:
        raise BadRequest(f"the payload is not valid {charset} text: {e}") from e


def parse_payload(request: Request) -> Any:
    """The predictor's `payload` for this request (see the module docstring for the rules)."""
    mimetype = request.mimetype
    if mimetype == "application/json" or mimetype.endswith("+json"):
        return parse_json(request.get_data())
    if mimetype in FORM_TYPES:
        return parse_form(request)
    if mimetype == "text/plain":
        return parse_text(request.get_data(), request.mimetype_params.get("charset") or "utf-8")
    return request.get_data()


def close_payload(payload: Any) -> None:
    """Release what a payload holds open (uploaded files); other payloads hold nothing."""
    if isinstance(payload, FormPayload):
        payload.close()
