"""A job submission body, validated at the edge into a `JobRequest`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from predictors_runtime.errors import BadRequest

SOURCES = ("item_list", "file_path_lister", "delimited_files", "retry_failed_of")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ItemList(_Strict):
    items: list[Any] = Field(min_length=1)
    batch_size: int = Field(ge=1)


class FileSource(_Strict):
    s3_paths: list[str] = Field(min_length=1)
    includes: list[str] = Field(default_factory=list)
    excludes: list[str] = Field(default_factory=list)
    batch_size: int = Field(ge=1)


class DeadLetterQueue(_Strict):
    arn: str = ""
    max_receive_count: int = Field(ge=1)


class OutputSpec(_Strict):
    """Where a job's returned rows go: `<path>/<job_id>/part-<batch index>.<format>`."""

    path: str = Field(min_length=1)
    format: Literal["jsonl", "parquet", "csv"] = "jsonl"


class JobRequest(_Strict):
    """What a user asked for; the API's queue, code and config come from its deployment."""

    workers: int = Field(default=1, ge=1)
    item_list: ItemList | None = None
    file_path_lister: FileSource | None = None
    delimited_files: FileSource | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    timeout: int | None = Field(default=None, ge=1)
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


def _describe(error: dict[str, Any]) -> str:
    path = ".".join(str(part) for part in error["loc"])
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown field"
    elif error["type"] == "missing":
        message = "field required"
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
        raise BadRequest("; ".join(_describe(err) for err in e.errors())) from e
    return request


def split_items(items: list[Any], batch_size: int) -> list[list[Any]]:
    return [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
