"""Celery messages of a task made without Celery's publishing path, so that a Redis script can push one
on its queue's list in the same step as the record it runs for (`jobs/asyncapi/store.py` `submit`).

Celery's `send_task` cost about 0.5 ms of CPU per message in the API process, half of what a
`POST /<name>` of an AsyncAPI cost (profiled with `bench/async_api.py`'s request): routing, the
protocol-2 headers, kombu's declare check, two JSON encodings, and a round trip of its own. An
AsyncAPI request's task is always one task name on one queue with different arguments, so per
process the first message of each (name, queue) is made by Celery and kombu themselves, kept
instead of sent (`jobs.transport.broker.captured_messages`), and every other is a copy of it with its own
task id, arguments and delivery tag: what the workers receive is what Celery would have sent
(tests/integration/test_broker_redis.py compares the two).

Only Sluice's own Redis channels can keep a message (`jobs.transport.broker.captures`); with another
transport, or a template this module cannot read (a kombu that encodes bodies otherwise),
`TaskMessages.message` answers None and the caller sends the task through Celery.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import orjson
from celery import Celery

from jobs.transport.broker import captured_messages, captures

log = logging.getLogger(__name__)

# The task id of the message Celery makes as a template (no task of that id is ever sent).
TEMPLATE_TASK_ID = "sluice-template"


def _json(value: Any) -> bytes:
    """JSON as a worker's decoder reads it: orjson's, or the standard library's for what orjson
    refuses (integers beyond 64 bits)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()


class _NoSentEvent:
    """Celery's event dispatcher, for the template only: with task events on (`SLUICE_TASK_EVENTS=1`),
    Celery announces every task it sends, and the template's `task-sent` would show Flower a task that
    never runs (`sluice-template`, pending forever). The messages made from it are announced by nobody
    either; their nodes' events (received, started, succeeded) are what Flower shows of them."""

    def publish(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass(frozen=True)
class QueuedMessage:
    """A task's message, ready for Redis: the list kombu would push it on, and the message as pushed."""

    key: str
    payload: bytes


@dataclass(frozen=True)
class _Template:
    key: str
    message: dict[str, Any]
    kwargs: Any  # the body's other two parts, as Celery wrote them: keyword arguments and the
    embed: Any   # callbacks, errbacks, chain and chord


class TaskMessages:
    """Messages of tasks as Celery would send them, made from one template per (task name, queue)."""

    def __init__(self, celery: Celery) -> None:
        self._celery = celery
        self._captures = captures(celery.conf.broker_transport)
        self._templates: dict[tuple[str, str], _Template | None] = {}
        self._lock = threading.Lock()

    def message(self, name: str, args: tuple[Any, ...], queue: str, task_id: str | None = None,
                argsrepr: str | None = None) -> QueuedMessage | None:
        """The message of task `name` with these (JSON) arguments on `queue`, with no stored result;
        None when this app's transport cannot keep Celery's template (send the task through Celery).
        `argsrepr` is what monitoring shows of the arguments (default: their repr; a batch's payload
        is not rendered)."""
        template = self._template(name, queue)
        if template is None:
            return None
        task_id = task_id or str(uuid.uuid4())
        body = _json([list(args), template.kwargs, template.embed])
        message = dict(template.message)
        message["body"] = base64.b64encode(body).decode()
        # Its own root, as a task sent from outside any task (a template made inside one names that one).
        message["headers"] = {**template.message["headers"], "id": task_id, "root_id": task_id, "parent_id": None,
                              "argsrepr": repr(args) if argsrepr is None else argsrepr}
        message["properties"] = {**template.message["properties"], "correlation_id": task_id,
                                 "delivery_tag": str(uuid.uuid4())}
        return QueuedMessage(template.key, _json(message))

    def _template(self, name: str, queue: str) -> _Template | None:
        if not self._captures:
            return None
        if (name, queue) in self._templates:
            return self._templates[(name, queue)]
        with self._lock, captured_messages() as kept:
            self._celery.send_task(name, args=("", ""), queue=queue, task_id=TEMPLATE_TASK_ID, ignore_result=True,
                                   add_to_parent=False, event_dispatcher=_NoSentEvent())
        template = None
        try:
            [(key, message)] = kept
            if message["properties"]["body_encoding"] != "base64":
                raise ValueError(f"a body encoded as {message['properties']['body_encoding']!r}, not base64")
            _, kwargs, embed = json.loads(base64.b64decode(message["body"]))
            template = _Template(key, message, kwargs, embed)
        except (ValueError, KeyError, TypeError) as e:  # never fatal: Celery sends these tasks itself
            log.warning("task %s on %s is sent through Celery: its message cannot be made here (%s)", name, queue, e)
        self._templates[(name, queue)] = template
        return template
