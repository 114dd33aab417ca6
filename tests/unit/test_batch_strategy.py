"""A batch message run by Sluice's Celery strategy (`jobs/transport/batch_strategy.py`): the task sees
its id and node, the worker state lists it while it runs, and the message is acknowledged or
rejected as Celery's own request would; what the strategy does not cover goes to Celery's.

A real Celery app and task; the consumer and the message are narrow fakes of what the strategy reads."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, signals
from celery.exceptions import Reject
from celery.worker import state as worker_state

import jobs.transport.batch_strategy
from jobs.tasks import BATCH_STRATEGY, RUN_BATCH, register_tasks
from jobs.transport.batch_strategy import batch_strategy


class Message:
    def __init__(self, task_id: str, args: list[Any], embed: dict[str, Any] | None = None, **headers: Any) -> None:
        self.headers = {"task": RUN_BATCH, "id": task_id, **headers}
        self.delivery_info = {"exchange": "", "routing_key": "job.j1"}
        self._body: Any = [args, {}, embed or {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]

    def decode(self) -> Any:
        return self._body


class Settled:
    """The ack and reject callbacks a consumer hands a strategy, recording what they were called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def ack(self, *args: Any) -> None:
        self.calls.append(("ack", *args))

    def reject(self, *args: Any) -> None:
        self.calls.append(("reject", *args))


class Consumer:
    """What the strategy reads of a node's consumer (a signal's sender: hashable)."""

    hostname = "node-1@host"
    connection_errors = (ConnectionError,)

    def __init__(self, revoked: set[str]) -> None:
        self.controller = SimpleNamespace(state=SimpleNamespace(revoked=revoked))


def node(events: bool = False, revoked: tuple[str, ...] = ()) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A Celery app with one batch-like task; the consumer fake; what the task saw at each call."""
    app = Celery("strategy-test", set_as_current=False)
    app.conf.worker_send_task_events = events
    seen: list[dict[str, Any]] = []

    def run(task: Any, job_id: str, index: int, fail: str = "") -> None:
        seen.append({"id": task.request.id, "hostname": task.request.hostname, "args": (job_id, index),
                     "active": [r.id for r in worker_state.active_requests]})
        if fail == "reject":
            raise Reject("Redis away", requeue=True)
        if fail == "raise":
            raise RuntimeError("not the batch's own failure")
        if fail == "cold shutdown":  # Celery's SIGQUIT handler, on the thread the batch runs on
            for request in tuple(worker_state.active_requests):
                if request.task.acks_late and not request.acknowledged:
                    request.cancel(None, emit_retry=False)

    task = app.task(name=RUN_BATCH, bind=True, acks_late=True, shared=False)(run)
    return task, Consumer(set(revoked)), seen


@pytest.fixture
def celery_default(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Celery's default strategy replaced by one that records the ids of the messages it was given."""
    given: list[str] = []

    def default(task: Any, app: Any, consumer: Any, **options: Any) -> Any:
        return lambda message, *args, **kwargs: given.append(message.headers["id"])

    monkeypatch.setattr(jobs.transport.batch_strategy, "default", default)
    return given


def test_sluices_batch_task_is_registered_with_this_strategy() -> None:
    app = Celery("registered", set_as_current=False)
    register_tasks(app, lambda: None)  # type: ignore[arg-type,return-value]  # never called here
    module, _, name = BATCH_STRATEGY.partition(":")
    assert app.tasks[RUN_BATCH].Strategy == BATCH_STRATEGY
    assert getattr(__import__(module, fromlist=[name]), name) is batch_strategy


def test_a_batch_runs_with_its_id_and_node_listed_as_active_then_is_acknowledged(celery_default: list[str]) -> None:
    task, consumer, seen = node()
    settled, received = Settled(), []
    handle = batch_strategy(task, task.app, consumer)

    def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
        received.append(request.id)

    signals.task_received.connect(on_received, weak=False)
    try:
        handle(Message("t-1", ["job-1", 3]), None, settled.ack, settled.reject, set())
    finally:
        signals.task_received.disconnect(on_received)

    assert seen == [{"id": "t-1", "hostname": "node-1@host", "args": ("job-1", 3), "active": ["t-1"]}]
    assert received == ["t-1"]
    assert [call[0] for call in settled.calls] == ["ack"]
    assert settled.calls[0][2] == (ConnectionError,)  # the consumer's connection errors, as Celery's request passes
    assert all(r.id != "t-1" for r in worker_state.active_requests)
    assert "t-1" not in worker_state.requests and task.request.id is None  # its context popped
    assert celery_default == []


def test_a_rejected_batch_is_rejected_with_its_requeue_and_not_acknowledged(celery_default: list[str]) -> None:
    task, consumer, _ = node()
    settled = Settled()

    batch_strategy(task, task.app, consumer)(Message("t-2", ["job-1", 0, "reject"]), None, settled.ack,
                                             settled.reject, set())

    assert [(call[0], call[-1]) for call in settled.calls] == [("reject", True)]
    assert all(r.id != "t-2" for r in worker_state.active_requests)


def test_a_task_that_raises_is_logged_and_acknowledged(celery_default: list[str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    task, consumer, seen = node()
    settled = Settled()

    with caplog.at_level(logging.ERROR, logger="jobs.transport.batch_strategy"):
        batch_strategy(task, task.app, consumer)(Message("t-3", ["job-1", 0, "raise"]), None, settled.ack,
                                                 settled.reject, set())

    assert len(seen) == 1 and [call[0] for call in settled.calls] == ["ack"]
    assert "t-3" in caplog.text and "not the batch's own failure" in caplog.text


@pytest.mark.parametrize("case", ["eta", "expires", "revoked", "task events", "callbacks", "protocol 1 body"])
def test_messages_it_does_not_cover_go_to_celerys_strategy(celery_default: list[str], case: str) -> None:
    task, consumer, seen = node(events=case == "task events", revoked=("t-4",) if case == "revoked" else ())
    headers = {case: "2026-11-28T21:00:00+00:00"} if case in ("eta", "expires") else {}
    embed = {"callbacks": [{"task": "other"}]} if case == "callbacks" else None
    message = Message("t-4", ["job-1", 0], embed, **headers)
    if case == "protocol 1 body":
        message._body = {"args": ["job-1", 0], "kwargs": {}, "retries": 0}
    settled = Settled()

    batch_strategy(task, task.app, consumer)(message, None, settled.ack, settled.reject, set())

    assert celery_default == ["t-4"] and seen == [] and settled.calls == []


def test_a_message_celery_cannot_read_is_rejected_without_requeue_and_counted_not_ending_the_node(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A JSON object on the broker (a writer other than Sluice): Celery's Request raises on it."""
    def default(task: Any, app: Any, consumer: Any, **options: Any) -> Any:
        def unreadable(message: Any, *args: Any, **kwargs: Any) -> None:
            raise ValueError("task keyword arguments must be a mapping")
        return unreadable

    monkeypatch.setattr(jobs.transport.batch_strategy, "default", default)
    counted: list[tuple[str, tuple[str, ...]]] = []
    monkeypatch.setattr(jobs.transport.batch_strategy.process_figures, "count",
                        lambda name, labels, amount=1: counted.append((name, labels)))
    task, consumer, seen = node()
    message = Message("t-5", ["job-1", 0])
    message._body = {"args": "not a list", "job": "j1"}
    settled = Settled()

    with caplog.at_level(logging.ERROR, logger="jobs.transport.batch_strategy"):
        batch_strategy(task, task.app, consumer)(message, None, settled.ack, settled.reject, set())

    assert [(call[0], call[-1]) for call in settled.calls] == [("reject", False)] and seen == []
    assert counted == [("sluice_unreadable_messages_total", (RUN_BATCH,))]
    assert "t-5" in caplog.text and "neither Sluice nor Celery can read" in caplog.text


def test_a_cold_shutdown_mid_batch_hands_the_batch_back_unrecorded_and_ends_the_node(
        celery_default: list[str]) -> None:
    task, consumer, seen = node()
    settled = Settled()
    try:
        batch_strategy(task, task.app, consumer)(Message("t-6", ["job-1", 0, "cold shutdown"]), None, settled.ack,
                                                 settled.reject, set())
        assert len(seen) == 1 and settled.calls == []  # neither acknowledged nor rejected: handed back
        assert worker_state.should_terminate is True
        assert all(r.id != "t-6" for r in worker_state.active_requests)
    finally:
        worker_state.should_terminate = None


def test_a_batch_handed_back_stays_in_its_nodes_in_flight_hash_for_its_next_life_to_give_back() -> None:
    from jobs.batch.steps import BatchRun, OpenDelivery
    from jobs.transport.batch_strategy import HandedBack
    from jobs.transport.delivery import Delivery

    class Nodes:
        def __init__(self) -> None:
            self.ended: list[str] = []

        def end_delivery(self, delivery: Delivery) -> None:
            self.ended.append(delivery.task_id)

    def cold(run: BatchRun) -> None:
        raise HandedBack("the node is shutting down cold")

    def ended_job(run: BatchRun) -> None:
        return None  # not recorded (its job ended meanwhile): the delivery leaves the hash

    nodes = Nodes()
    step = OpenDelivery(nodes)  # type: ignore[arg-type]
    with pytest.raises(HandedBack):
        step(BatchRun("j1", 0, [1], None, Delivery("n1", "t-7"), open_delivery=Delivery("n1", "t-7")), cold)
    step(BatchRun("j1", 1, [1], None, Delivery("n1", "t-8"), open_delivery=Delivery("n1", "t-8")), ended_job)
    assert nodes.ended == ["t-8"]
