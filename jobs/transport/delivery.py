"""A delivery: one Celery message of a job (a batch, or the job's completion) taken by one node.

While a node runs a delivery, its task id sits in the node's in-flight hash with an entry naming
the job and the batch, so that if the node dies the message can be given back at once
(`jobs/transport/settle.py`). These are the values both the batch ledger (which enters and removes a batch's
entry atomically with its outcome) and the node registry (`jobs/nodes/registry.py`) speak in.
"""

from __future__ import annotations

from dataclasses import dataclass

# The in-flight entry of a job's completion task, in place of a batch index.
COMPLETION_ENTRY = "complete"
# An AsyncAPI request's in-flight entry is "request/<api>/<request id>" (neither holds ':' or '/'):
# it belongs to no job. Settling gives it back like any other; its next delivery, finding the
# request ended, only acknowledges it (`jobs/asyncapi/runner.py`).
REQUEST_ENTRY_PREFIX = "request/"


@dataclass(frozen=True)
class Delivery:
    """Which node runs a batch, and the Celery task id of its message (to give it back if the node dies)."""

    node: str
    task_id: str


def inflight_entry(job_id: str, index: int | str) -> str:
    """What a node's in-flight hash holds for a task: "<job id>:<batch index>" or "<job id>:complete"."""
    return f"{job_id}:{index}"


def request_entry(api_name: str, request_id: str) -> str:
    """What a node's in-flight hash holds while it runs an AsyncAPI request."""
    return f"{REQUEST_ENTRY_PREFIX}{api_name}/{request_id}"


def is_request_entry(entry: str) -> bool:
    """Whether an in-flight entry is an AsyncAPI request's (not a job's)."""
    return entry.startswith(REQUEST_ENTRY_PREFIX)


def job_of_entry(entry: str) -> str:
    """The job id of an in-flight entry (whatever follows it)."""
    return entry.rpartition(":")[0]


def parse_inflight_entry(entry: str) -> tuple[str, int | None]:
    """(job id, batch index), the index None for a completion task."""
    job_id, _, what = entry.rpartition(":")
    return job_id, None if what == COMPLETION_ENTRY else int(what)
