"""One request of an AsyncAPI: its status, its record as stored, and its payload as Cortex read it.

A request is stored when it is submitted (`in_queue`), taken by a worker node (`in_progress`),
and ends `completed` (its result in storage) or `failed` (a one-line message), exactly once
(`jobs/asyncapi/store.py`). Its payload follows the Content-Type it was sent with, as in Cortex:
JSON -> the parsed value, `text/plain` -> `str`, anything else -> `bytes`.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from foundation.errors import BadRequest
from foundation.redis_clients import text

# A client's `X-Request-ID` is the request's id when it matches this; otherwise a new one is made.
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RequestStatus(enum.StrEnum):
    """Where a request stands (Cortex's AsyncAPI statuses)."""

    IN_QUEUE = "in_queue"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in (RequestStatus.COMPLETED, RequestStatus.FAILED)


class PayloadKind(enum.StrEnum):
    """How a request's body is handed to `predict`."""

    JSON = "json"
    TEXT = "text"
    BYTES = "bytes"


def valid_request_id(value: str | None) -> bool:
    """Whether a client's `X-Request-ID` can be a request's id (it becomes part of keys and paths)."""
    return bool(value) and _REQUEST_ID_RE.match(value or "") is not None


def payload_kind(content_type: str | None) -> PayloadKind:
    """The kind of a body by its Content-Type (parameters such as `charset` ignored)."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime == "application/json" or mime.endswith("+json"):
        return PayloadKind.JSON
    if mime == "text/plain":
        return PayloadKind.TEXT
    return PayloadKind.BYTES


def check_payload(kind: PayloadKind, body: bytes) -> None:
    """`BadRequest` for a body its kind cannot be read as (invalid JSON, text that is not UTF-8)."""
    try:
        decode_payload(kind, body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid {kind.value}: {e}") from e


def decode_payload(kind: PayloadKind, body: bytes) -> Any:
    """What `predict` receives as `payload`."""
    if kind is PayloadKind.JSON:
        return json.loads(body)
    if kind is PayloadKind.TEXT:
        return body.decode("utf-8")
    return bytes(body)


def one_line(message: str, limit: int = 1000) -> str:
    """A failure's message as a request shows it: one line, bounded."""
    line = " ".join(message.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True)
class AsyncRequest:
    """A request's record, as `jobs/asyncapi/store.py` keeps it (`to_dict` spells every field)."""

    api_name: str
    request_id: str
    status: RequestStatus
    kind: PayloadKind
    created: float
    payload: bytes | None = None  # inline when small
    payload_uri: str = ""  # else where it is stored
    result: bytes | None = None  # a completed request's result (JSON), inline when small
    result_uri: str = ""  # else where it is stored
    message: str = ""  # a failed request's reason
    timestamp: float | None = None  # when it completed or failed
    deliveries: int = 0  # times a node took it (more than one: a node died running it)

    def to_dict(self) -> dict[str, str | bytes]:
        """The stored fields (a Redis hash); empty ones left out."""
        fields: dict[str, str | bytes] = {
            "status": self.status.value, "kind": self.kind.value, "created": repr(self.created),
            "deliveries": str(self.deliveries),
        }
        if self.payload is not None:
            fields["payload"] = self.payload
        if self.result is not None:
            fields["result"] = self.result
        for name in ("payload_uri", "result_uri", "message"):
            value = getattr(self, name)
            if value:
                fields[name] = value
        if self.timestamp is not None:
            fields["timestamp"] = repr(self.timestamp)
        return fields

    @classmethod
    def from_fields(cls, api_name: str, request_id: str, raw: Mapping[bytes | str, bytes | str]) -> AsyncRequest:
        """The record from its stored hash (as redis-py returns it: bytes)."""
        by_name = {text(k): (v.encode() if isinstance(v, str) else v) for k, v in raw.items()}

        def str_of(name: str) -> str:
            value = by_name.get(name)
            return value.decode() if value is not None else ""

        timestamp = str_of("timestamp")
        return cls(
            api_name=api_name, request_id=request_id, status=RequestStatus(str_of("status")),
            kind=PayloadKind(str_of("kind") or PayloadKind.BYTES.value), created=float(str_of("created") or 0),
            payload=by_name.get("payload"), payload_uri=str_of("payload_uri"), result=by_name.get("result"),
            result_uri=str_of("result_uri"),
            message=str_of("message"), timestamp=float(timestamp) if timestamp else None,
            deliveries=int(str_of("deliveries") or 0),
        )
