"""Submitting an AsyncAPI request (`jobs/asyncapi/submit.py`) with the in-memory request store: its task's
message is queued by the step that stores it, or sent through Celery where it cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from foundation.errors import ApiNotFound
from foundation.limits import ASYNC_INLINE_PAYLOAD_BYTES
from jobs.asyncapi.memory import MemoryAsyncRequests
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.request import RequestStatus
from jobs.asyncapi.submit import Submission, submit_request
from jobs.tasks import RUN_ASYNC, RUN_ASYNC_QUEUED
from jobs.transport.task_messages import QueuedMessage, TaskMessages


class SentTasks(Celery):
    """A Celery app that only notes the tasks sent through it."""

    def __init__(self) -> None:
        super().__init__("sent-tasks", broker="memory://", set_as_current=False)
        self.sent: list[tuple[str, Any, str]] = []

    def send_task(self, name: str, args: Any = None, **options: Any) -> None:  # type: ignore[override]
        self.sent.append((name, args, options["queue"]))


class Messages(TaskMessages):
    """Task messages as the Redis transport makes them, in a form the test reads back."""

    def message(self, name: str, args: tuple[str, ...], queue: str, task_id: str | None = None) -> QueuedMessage:
        return QueuedMessage(queue, json.dumps([name, list(args)]).encode())


def submission(body: bytes = b'{"n": 1}', **fields: Any) -> Submission:
    return Submission(api_name="echo", body=body, content_type="application/json", **fields)


def test_a_requests_task_is_queued_by_the_step_that_stores_it_and_sent_by_no_one_else(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    request_id = submit_request(store, RequestObjects(str(tmp_path)), celery, submission(), 10.0, Messages(celery))
    assert store.pushed == {"async.echo": [json.dumps([RUN_ASYNC, ["echo", request_id]]).encode()]}
    assert celery.sent == []
    assert store.get("echo", request_id).status is RequestStatus.IN_QUEUE  # type: ignore[union-attr]


def test_a_resubmitted_request_id_queues_no_second_task(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    for _ in range(2):
        submit_request(store, RequestObjects(str(tmp_path)), celery, submission(client_request_id="mine"), 10.0,
                       Messages(celery))
    assert len(store.pushed["async.echo"]) == 1 and celery.sent == []


def test_another_transport_sends_through_celery(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    objects = RequestObjects(str(tmp_path))
    first = submit_request(store, objects, celery, submission(), 10.0, TaskMessages(celery))  # memory://
    submit_request(store, objects, celery, submission(batched=True), 10.0, TaskMessages(celery))
    assert store.pushed == {}
    assert celery.sent == [(RUN_ASYNC, ("echo", first), "async.echo"), (RUN_ASYNC_QUEUED, ("echo",), "async.echo")]


LARGE = b'"' + b"x" * ASYNC_INLINE_PAYLOAD_BYTES + b'"'


def test_a_large_payload_is_in_storage_before_its_request_is_stored_with_its_task(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    objects = RequestObjects(str(tmp_path))
    request_id = submit_request(store, objects, celery, submission(LARGE), 10.0, Messages(celery))
    stored = store.get("echo", request_id)
    assert stored is not None and stored.payload is None
    assert objects.read(stored.payload_uri) == LARGE
    assert store.pushed == {"async.echo": [json.dumps([RUN_ASYNC, ["echo", request_id]]).encode()]}
    assert celery.sent == []


def test_a_large_batched_request_is_offered_to_batches_in_the_step_that_stores_it(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    request_id = submit_request(store, RequestObjects(str(tmp_path)), celery, submission(LARGE, batched=True), 10.0,
                                Messages(celery))
    assert store.pushed == {"async.echo": [json.dumps([RUN_ASYNC_QUEUED, ["echo"]]).encode()]}
    assert [r for r, _ in store.claim("echo", "task-1", 5, 11.0)] == [request_id]


def test_a_resubmitted_id_keeps_the_payload_it_was_stored_with_and_leaves_no_other(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    objects = RequestObjects(str(tmp_path))
    submit_request(store, objects, celery, submission(LARGE, client_request_id="mine"), 10.0, Messages(celery))
    other = b'"' + b"y" * ASYNC_INLINE_PAYLOAD_BYTES + b'"'
    submit_request(store, objects, celery, submission(other, client_request_id="mine"), 11.0, Messages(celery))
    assert objects.read(store.get("echo", "mine").payload_uri) == LARGE  # type: ignore[union-attr]
    assert [p.name for p in (tmp_path / "async" / "echo" / "mine").iterdir()] == [
        Path(store.get("echo", "mine").payload_uri).name]  # type: ignore[union-attr]


def test_a_payload_whose_request_could_not_be_stored_is_deleted(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(registered=lambda name: False), SentTasks()  # the API was deleted
    with pytest.raises(ApiNotFound):
        submit_request(store, RequestObjects(str(tmp_path)), celery, submission(LARGE), 10.0, Messages(celery))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_burst_of_batched_requests_pushes_one_task_for_the_queued_ones_until_it_starts(tmp_path: Path) -> None:
    store, celery = MemoryAsyncRequests(), SentTasks()
    for _ in range(3):
        submit_request(store, RequestObjects(str(tmp_path)), celery, submission(batched=True), 10.0, Messages(celery))
    assert store.pushed == {"async.echo": [json.dumps([RUN_ASYNC_QUEUED, ["echo"]]).encode()]}
    assert celery.sent == []


def test_only_sluices_redis_channels_can_keep_a_template(tmp_path: Path) -> None:
    assert TaskMessages(Celery("other", broker="memory://", set_as_current=False)).message(
        RUN_ASYNC, ("echo", "r1"), "async.echo") is None


def test_a_template_that_cannot_be_kept_sends_through_celery_from_then_on(caplog: Any) -> None:
    celery = Celery("memory", broker="memory://", set_as_current=False)
    messages = TaskMessages(celery)
    messages._captures = True  # as if its channel kept messages: kombu's memory channel sends this one instead
    assert messages.message(RUN_ASYNC, ("echo", "r1"), "async.echo") is None
    assert messages.message(RUN_ASYNC, ("echo", "r2"), "async.echo") is None  # not tried again
    assert [r.getMessage() for r in caplog.records].count(
        "task sluice.run_async on async.echo is sent through Celery: its message cannot be made here "
        "(not enough values to unpack (expected 1, got 0))") == 1
