"""Reading a JSON request body within limits, so that no body can crash the API process.

Python's `json` recurses once per nesting level and raises `RecursionError` near depth 1,000;
it refuses integers of more than 4,300 digits with a bare `ValueError`; and it accepts lone
UTF-16 surrogates (`"\\ud800"`), which are not text and fail later wherever the string is
encoded (Redis, logs, storage paths). Each of those once answered 500. Here the depth and the
number lengths are checked on the raw bytes before parsing (C-speed regular expressions, no
recursion), and strings are checked after, only when the body escapes a surrogate at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

from foundation.errors import BadRequest

# Levels of arrays and objects in a body: Cortex payloads (rows, images as nested lists) need a
# handful; the job's `config` sits at level 2.
MAX_JSON_DEPTH = 64
# Digits of one number: Python's own limit on reading integers (sys.get_int_max_str_digits()).
MAX_JSON_NUMBER_DIGITS = 4300

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_LEAF_CONTAINER = re.compile(rb"[\[{][^\[\]{}]*[\]}]")
_BRACKET = re.compile(rb"[\[\]{}]")
_LONG_NUMBER = re.compile(rb"[0-9]{%d}" % (MAX_JSON_NUMBER_DIGITS + 1))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


def _nested_deeper_than(text: bytes, limit: int) -> bool:
    """Whether arrays and objects (strings already removed) nest deeper than `limit`.

    Each pass replaces every innermost container by a scalar, peeling one level; brackets left
    after `limit` passes mean a deeper nesting. Unbalanced brackets stop the peeling early and
    are left for the parser to report.
    """
    for _ in range(limit):
        text, peeled = _LEAF_CONTAINER.subn(b"0", text)
        if not peeled:
            return False
    return _BRACKET.search(text) is not None


def _where(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or "the body"


def _lone_surrogate_at(value: Any) -> str | None:
    """The field path of the first string (key or value) holding a lone surrogate, if any."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if not node.isascii():
                try:
                    node.encode("utf-8")
                except UnicodeEncodeError:
                    return _where(path)
        elif isinstance(node, dict):
            for key, item in node.items():
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    return _where(path) + " (a key)"
                stack.append((item, [*path, key]))
        elif isinstance(node, list):
            stack.extend((item, [*path, i]) for i, item in enumerate(node))
    return None


def parse_json_body(raw: bytes, what: str = "request body") -> Any:
    """The decoded body; `BadRequest` naming the limit or the field for anything unreadable."""
    skeleton = _STRING.sub(b'""', raw)
    if _nested_deeper_than(skeleton, MAX_JSON_DEPTH):
        raise BadRequest(f"{what} is nested deeper than the limit of {MAX_JSON_DEPTH} levels of arrays and objects")
    if _LONG_NUMBER.search(skeleton):
        raise BadRequest(f"{what} holds a number of more than the limit of {MAX_JSON_NUMBER_DIGITS} digits")
    try:
        text = raw.decode("utf-8-sig")  # RFC 8259: JSON between systems is UTF-8
    except UnicodeDecodeError as e:
        raise BadRequest(f"{what} is not UTF-8 text: {e}") from e
    try:
        body = json.loads(text)
    except RecursionError as e:  # not expected after the depth check; never a 500 all the same
        raise BadRequest(f"{what} is nested deeper than the limit of {MAX_JSON_DEPTH} levels") from e
    except ValueError as e:  # JSONDecodeError, Python's integer length limit
        raise BadRequest(f"{what} is not valid JSON: {e}") from e
    if _SURROGATE_ESCAPE.search(raw):
        where = _lone_surrogate_at(body)
        if where is not None:
            raise BadRequest(f"{where}: not valid Unicode text (a lone UTF-16 surrogate escape such as \\ud800)")
    return body
