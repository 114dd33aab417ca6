"""The body of a job submission as Sluice's clients write it: one builder for the Python client
and the CLI, so that `--tries` or `timeout` cannot mean one thing in one and another in the other.
(The server reads it with `jobs/batch/submission.py`.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def submission_body(
    body: Mapping[str, Any] | None = None, *, items: list[Any] | None = None, batch_size: int | None = None,
    workers: int | None = None, config: Mapping[str, Any] | None = None, timeout: int | None = None,
    tries: int | None = None,
) -> dict[str, Any]:
    """A BatchAPI submission: `body` (a whole one, as a file holds it) with what is given put over
    it; an item list when `items` is given. `workers` is 1 unless given or in `body`; `tries` is
    Cortex's dead-letter queue's `max_receive_count`, the tries each batch gets."""
    out = dict(body or {})
    if items is not None:
        out["item_list"] = {"items": items, "batch_size": batch_size}
    if workers is not None:
        out["workers"] = workers
    out.setdefault("workers", 1)
    out.update(task_submission_body(config, timeout))
    if tries is not None:
        out["sqs_dead_letter_queue"] = {"arn": "", "max_receive_count": tries}
    return out


def task_submission_body(config: Mapping[str, Any] | None = None, timeout: int | None = None) -> dict[str, Any]:
    """A TaskAPI submission: the job's config (merged over the API's by the server) and its timeout."""
    out: dict[str, Any] = {}
    if config:
        out["config"] = dict(config)
    if timeout is not None:
        out["timeout"] = timeout
    return out
