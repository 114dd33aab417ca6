"""A delivery: one Celery message of a job (a batch, or the job's completion) taken by one node.

While a node runs a delivery, its task id sits in the node's in-flight hash with an entry naming
the job and the batch, so that if the node dies the message can be given back at once
(`jobs/transport/settle.py`). These are the values both the batch ledger (which enters and removes a batch's
entry atomically with its outcome) and the node registry (`jobs/nodes/registry.py`) speak in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The in-flight entry of a job's completion task, in place of a batch index.
COMPLETION_ENTRY = "complete"
# An AsyncAPI request's in-flight entry is "request/<api>/<request id>" (neither holds ':' or '/'):
# it belongs to no job. Settling gives it back like any other; its next delivery, finding the
# request ended, only acknowledges it (`jobs/asyncapi/runner.py`).
REQUEST_ENTRY_PREFIX = "request/"


# kombu's Redis transport keeps each message a node has taken and not acknowledged in this hash
# (delivery tag -> the message as JSON) and this sorted set (delivery tag -> when taken): kombu's
# `Channel.unacked_key` and `Channel.unacked_index_key` (tests/unit/test_broker_receipts.py holds them equal).
BROKER_UNACKED = "unacked"
BROKER_UNACKED_INDEX = "unacked_index"


@dataclass
class BrokerReceipt:
    """A batch message's place in the broker's unacknowledged hash, written by the batch's store calls
    instead of in round trips of their own (`jobs/transport/broker.py`).

    kombu writes a message into its unacknowledged hash when a node takes it, and takes it out when
    the node acknowledges it: two round trips per batch beside the batch ledger's two. For a batch
    run as soon as it is taken, the transport leaves the first write (`unacked`, the JSON kombu would
    have written, taken at `taken_at`) to the script that begins the batch, and the script that
    records it removes the entry; `written` and `acknowledged` say what the scripts did, or were
    sent to do (their answers may be read later: `jobs/store/answers.py`), so that the transport
    writes or removes only what they do not.
    """

    tag: str
    task_id: str
    unacked: str = ""       # the entry still to write; "" when the transport wrote it already
    taken_at: float = 0.0
    written: bool = False
    acknowledged: bool = False


@dataclass(frozen=True)
class Delivery:
    """Which node runs a batch, and the Celery task id of its message (to give it back if the node dies);
    for a batch, its broker receipt when the transport has one."""

    node: str
    task_id: str
    receipt: BrokerReceipt | None = field(default=None, compare=False)


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
