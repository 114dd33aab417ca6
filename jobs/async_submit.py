"""Submitting an AsyncAPI request: store it, then queue a task for it on the API's own queue, which
the nodes placed on the API consume (`jobs/async_placement.py`).

Without `server_side_batching`, one task per request: with its payload inline, its message is pushed
on the queue by the same script that stores the request (`jobs/task_messages.py`: one round trip, and
none of Celery's publishing cost), else sent through Celery once the payload is stored. With it, the
request's id joins the API's queued list and a task is sent only when none is on its way already
(`AsyncRequestStore.queue`): the node running it claims up to `max_batch_size` of the queued
requests and sends the next task when some are left, so a burst costs one task per batch instead of
one per request.

The task carries only the API's name and the request's id; the payload sits in the request's
record when small, else in storage (`jobs/async_objects.py`). A client that sends the same
`X-Request-ID` twice gets the same request, queued once.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from celery import Celery

from foundation.limits import ASYNC_INLINE_PAYLOAD_BYTES

from .async_objects import PAYLOAD, RequestObjects
from .async_placement import async_queue
from .async_request import AsyncRequest, RequestStatus, check_payload, payload_kind, valid_request_id
from .async_store import AsyncRequestStore
from .task_messages import TaskMessages
from .tasks import RUN_ASYNC, RUN_ASYNC_QUEUED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """One request as the API received it."""

    api_name: str
    body: bytes
    content_type: str | None
    client_request_id: str | None = None
    batched: bool = False  # the API has `server_side_batching`: its id is queued for nodes to claim


def send_request(celery: Celery, api_name: str, request_id: str) -> None:
    """Queue the task that runs the request, on the API's own queue (`jobs/async_placement.py`)."""
    celery.send_task(RUN_ASYNC, args=(api_name, request_id), queue=async_queue(api_name), ignore_result=True,
                     add_to_parent=False)


def send_queued_task(celery: Celery, api_name: str, store: AsyncRequestStore | None = None,
                     messages: TaskMessages | None = None) -> None:
    """Queue a task that runs a batch of the API's queued requests (`server_side_batching`), on its own
    queue: pushed by `store` when `messages` can make it (one round trip, none of Celery's publishing
    cost, paid once per batch), else sent through Celery."""
    message = None
    if store is not None and messages is not None:
        message = messages.message(RUN_ASYNC_QUEUED, (api_name,), async_queue(api_name))
    if message is not None and store is not None:
        store.send(message)
        return
    celery.send_task(RUN_ASYNC_QUEUED, args=(api_name,), queue=async_queue(api_name), ignore_result=True,
                     add_to_parent=False)


def submit_request(store: AsyncRequestStore, objects: RequestObjects, celery: Celery, submission: Submission,
                   now: float, messages: TaskMessages | None = None) -> str:
    """Store the request and queue it; returns its id. `BadRequest` for a body its type cannot be read as.
    `messages`: where its task's message is made to be queued with the record (else Celery sends it)."""
    kind = payload_kind(submission.content_type)
    check_payload(kind, submission.body)
    given = submission.client_request_id
    request_id = given if given is not None and valid_request_id(given) else uuid.uuid4().hex
    api_name = submission.api_name
    small = len(submission.body) <= ASYNC_INLINE_PAYLOAD_BYTES
    payload_uri = "" if small else objects.uri(api_name, request_id, PAYLOAD)
    request = AsyncRequest(
        api_name=api_name, request_id=request_id, status=RequestStatus.IN_QUEUE, kind=kind, created=now,
        payload=submission.body if small else None, payload_uri=payload_uri,
    )
    # With its payload inline, a batched request is offered to batches in the same step it is stored,
    # and another's task queued in that step too.
    task_message = None
    if small and not submission.batched and messages is not None:
        task_message = messages.message(RUN_ASYNC, (api_name, request_id), async_queue(api_name))
    submitted = store.submit(request, now, queued=submission.batched and small, message=task_message)
    if not submitted.created:
        log.info("async request %s of api %s exists already; not queued again", request_id, api_name)
        return request_id
    try:
        if not small:  # written only for the request it belongs to: a duplicate id never overwrites it
            objects.put_payload(api_name, request_id, submission.body)
        if not submission.batched:
            if task_message is None:  # else queued with the record already
                send_request(celery, api_name, request_id)
        elif submitted.wake or (not small and store.queue(api_name, request_id)):  # offered once its payload is stored
            send_queued_task(celery, api_name, store, messages)
    except Exception as e:
        message = f"storing or queueing the request failed: {e}"
        store.finish(api_name, request_id, RequestStatus.FAILED, now, message=message)
        if submission.batched:  # no task went out for the queue: the next request sends one
            store.woken(api_name)
        raise
    return request_id
