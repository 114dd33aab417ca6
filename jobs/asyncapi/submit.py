"""Submitting an AsyncAPI request: store it, then queue a task for it on the API's own queue, which
the nodes placed on the API consume (`jobs/placement/asyncapi.py`).

Without `server_side_batching`, one task per request: its message is pushed on the queue by the same
script that stores the request (`jobs/transport/task_messages.py`: one round trip, and none of Celery's
publishing cost), or, on a broker transport that cannot make it, sent through Celery just after.
With it, the request's id joins the API's queued list in that script, and a task is sent only when
none is on its way already: the node running it claims up to `max_batch_size` of the queued
requests and sends the next task when some are left, so a burst costs one task per batch instead of
one per request.

The task carries only the API's name and the request's id; the payload sits in the request's
record when small, else in storage (`jobs/asyncapi/objects.py`), written before the request is stored.
A client that sends the same `X-Request-ID` twice gets the same request, queued once (the second
submission's copy of a large payload is deleted again).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from celery import Celery

from foundation.limits import ASYNC_INLINE_PAYLOAD_BYTES
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.request import AsyncRequest, RequestStatus, check_payload, payload_kind, valid_request_id
from jobs.asyncapi.store import AsyncRequestStore
from jobs.placement.asyncapi import async_queue
from jobs.tasks import RUN_ASYNC, RUN_ASYNC_QUEUED
from jobs.transport.task_messages import TaskMessages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    """One request as the API received it."""

    api_name: str
    body: bytes
    content_type: str | None
    client_request_id: str | None = None
    batched: bool = False  # the API has `server_side_batching`: its id is queued for nodes to claim
    # The registry generation the API's route was read at: the request is stored only while the registry
    # is still at it (else `RouteChanged`, nothing stored). None: not checked.
    route_generation: int | None = None


def send_request(celery: Celery, api_name: str, request_id: str) -> None:
    """Queue the task that runs the request, on the API's own queue (`jobs/placement/asyncapi.py`)."""
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
    # A large payload is in storage before its request exists, so that the request can be queued (or offered
    # to batches) in the step that stores it: a node never takes a request whose payload is still on its way.
    payload_uri = "" if small else objects.put_payload(api_name, request_id, submission.body)
    request = AsyncRequest(
        api_name=api_name, request_id=request_id, status=RequestStatus.IN_QUEUE, kind=kind, created=now,
        payload=submission.body if small else None, payload_uri=payload_uri,
    )
    task_message = None
    if not submission.batched and messages is not None:
        task_message = messages.message(RUN_ASYNC, (api_name, request_id), async_queue(api_name))
    try:
        submitted = store.submit(request, now, queued=submission.batched, message=task_message,
                                 generation=submission.route_generation)
    except Exception:
        if payload_uri:
            objects.discard(payload_uri)
        raise
    if not submitted.created:
        log.info("async request %s of api %s exists already; not queued again", request_id, api_name)
        if payload_uri:  # this submission's own copy: the request of that id keeps the one it was stored with
            objects.discard(payload_uri)
        return request_id
    try:
        if not submission.batched:
            if task_message is None:  # else queued with the record already
                send_request(celery, api_name, request_id)
        elif submitted.wake:
            send_queued_task(celery, api_name, store, messages)
    except Exception as e:
        message = f"queueing the request failed: {e}"
        store.finish(api_name, request_id, RequestStatus.FAILED, now, message=message)
        if submission.batched:  # no task went out for the queue: the next request sends one
            store.woken(api_name)
        raise
    return request_id
