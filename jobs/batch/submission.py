"""A job submission body, validated at the edge into a `JobRequest`."""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import annotated_types
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from foundation.errors import BadRequest
from foundation.limits import MAX_BATCH_TIMEOUT_S

SOURCES = ("item_list", "file_path_lister", "delimited_files", "retry_failed_of")

# Every number a submission carries is bounded here, at the edge: an unbounded one once let a
# 401-digit `timeout` through, and beat's `start_time + timeout` then failed on every tick.
# Bounds are declared as `Field(ge=..., le=...)`; `describe_error` reads them back for the message.
MAX_WORKERS = 1000
MAX_BATCH_SIZE = 1_000_000
MAX_JOB_TIMEOUT_S = 30 * 24 * 3600
MAX_TRIES = 1000  # SQS's own bound on maxReceiveCount


def _clean_path_text(value: str) -> str:
    """Paths and patterns reach the OS and storage clients, which refuse NUL and lone surrogates."""
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError("must be valid Unicode text (found a lone UTF-16 surrogate)") from e
    return value


PathText = Annotated[str, AfterValidator(_clean_path_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ItemList(_Strict):
    items: list[Any] = Field(min_length=1)
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)


class FileSource(_Strict):
    s3_paths: list[PathText] = Field(min_length=1)
    includes: list[PathText] = Field(default_factory=list)
    excludes: list[PathText] = Field(default_factory=list)
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)


class DeadLetterQueue(_Strict):
    arn: str = ""
    max_receive_count: int = Field(ge=1, le=MAX_TRIES)


class OutputSpec(_Strict):
    """Where a job's returned rows go: `<path>/<job_id>/part-<batch index>.<format>`."""

    path: PathText = Field(min_length=1)
    format: Literal["jsonl", "parquet", "csv"] = "jsonl"


class JobRequest(_Strict):
    """What a user asked for; the API's queue, code and config come from its deployment."""

    workers: int = Field(default=1, ge=1, le=MAX_WORKERS)
    item_list: ItemList | None = None
    file_path_lister: FileSource | None = None
    delimited_files: FileSource | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    timeout: int | None = Field(default=None, ge=1, le=MAX_JOB_TIMEOUT_S)
    # Seconds one try of a batch may run (else the API's `predictor.batch_timeout`, else SLUICE_BATCH_TIMEOUT).
    batch_timeout: float | None = Field(default=None, gt=0, le=MAX_BATCH_TIMEOUT_S)
    sqs_dead_letter_queue: DeadLetterQueue | None = None
    output: OutputSpec | None = None
    # Re-run only the failed batches of an earlier, ended job of the same API.
    retry_failed_of: str | None = Field(default=None, min_length=1)

    @property
    def tries(self) -> int:
        """Tries per batch: `max_receive_count` of the dead-letter policy, else one."""
        return self.sqs_dead_letter_queue.max_receive_count if self.sqs_dead_letter_queue else 1

    @property
    def source(self) -> str:
        """The name of the one input source given."""
        return next(name for name in SOURCES if getattr(self, name) is not None)


_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def _field_of(loc: tuple[Any, ...], root: type[BaseModel]) -> Any:
    """The pydantic `FieldInfo` an error location names, following nested submission models."""
    model: Any = root
    field = None
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = next((t for t in (field.annotation, *typing.get_args(field.annotation))
                      if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return field


def _range_of(loc: tuple[Any, ...], root: type[BaseModel]) -> str | None:
    """`from 1 to 1000` for a field declared with `ge=1, le=1000` (and the like), else None."""
    field = _field_of(loc, root)
    if field is None:
        return None
    low = high = None
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge):
            low = f"at least {rule.ge}"
        elif isinstance(rule, annotated_types.Gt):
            low = f"greater than {rule.gt}"
        elif isinstance(rule, annotated_types.Le):
            high = f"at most {rule.le}"
        elif isinstance(rule, annotated_types.Lt):
            high = f"less than {rule.lt}"
    if low and high and low.startswith("at least") and high.startswith("at most"):
        return f"from {low.removeprefix('at least ')} to {high.removeprefix('at most ')}"
    return " and ".join(part for part in (low, high) if part) or None


def _shown(value: Any) -> str:
    """A value as the message quotes it: a 401-digit number is not repeated whole."""
    if isinstance(value, int) and value.bit_length() > 64:  # str() refuses past 4300 digits anyway
        digits = int(value.bit_length() * math.log10(2)) + 1
        if abs(value) < 10 ** (digits - 1):
            digits -= 1
        return f"an integer of {digits} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_error(error: Mapping[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error of a body validated as `root`, as `field.path: what is wrong`."""
    path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif error["type"] == "missing":
        message = "field required"
    elif error["type"] in _BOUND_ERRORS and (allowed := _range_of(tuple(error["loc"]), root)) is not None:
        message = f"must be {allowed} (got {_shown(error.get('input'))})"
    elif error["type"] == "value_error":
        message = str(error.get("ctx", {}).get("error", message))
    return f"{path}: {message}" if path else message


def parse_job_request(body: Any) -> JobRequest:
    """Validate a decoded JSON body; every problem is a `BadRequest` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the job submission must be a JSON object")
    given = [name for name in SOURCES if body.get(name) is not None]
    if len(given) != 1:
        found = f"got {' and '.join(given)}" if given else "got none"
        raise BadRequest(f"exactly one of {', '.join(SOURCES)} is required; {found}")
    try:
        request = JobRequest.model_validate(body)
    except ValidationError as e:
        raise BadRequest("; ".join(describe_error(err, JobRequest) for err in e.errors())) from e
    return request


def split_items(items: list[Any], batch_size: int) -> list[list[Any]]:
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
