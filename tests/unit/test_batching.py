"""Server-side batching: every caller gets its own answer, a failed batch fails all its callers, nobody hangs.

These are the failures Cortex's batcher (a short list left requests spinning, cortex #1915) and
MLServer's (merged or empty answers to concurrent callers, mlserver #1306) shipped with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from foundation.errors import ModelInputError, PredictorError, RequestTimeout
from predictors_runtime.batching import Batcher, BatchFailed
from predictors_runtime.config import ServerSideBatching
from predictors_runtime.realtime_predictor import RealtimePredictor, RequestArgs

JOIN_TIMEOUT_S = 30.0


def run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run `target(i)` on `count` threads started together; each result or exception, by index."""
    outcomes: list[Any] = [None] * count
    start = threading.Barrier(count)

    def body(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = target(i)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcomes[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a caller is still waiting for its batch"
    return outcomes


class Recorder:
    """A batch function that doubles every item and remembers the batches it ran."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0
        self.working = threading.Event()  # never set

    def __call__(self, items: list[int]) -> list[int]:
        with self.lock:
            self.batches.append(list(items))
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        self.working.wait(0.001)  # the model's work: time for a second batch to overlap, were batches concurrent
        with self.lock:
            self.running -= 1
        return [item * 2 for item in items]


def test_64_concurrent_callers_each_get_their_own_answer_across_many_batches():
    recorder = Recorder()
    batcher = Batcher(recorder, max_batch_size=8, interval_s=0.005)
    per_thread = 25

    def caller(i: int) -> list[tuple[int, int]]:
        return [(n, batcher.submit(n)) for n in range(i * 1000, i * 1000 + per_thread)]

    outcomes = run_threads(64, caller)

    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
        assert all(answer == n * 2 for n, answer in outcome)
    answered = sum(answer for outcome in outcomes for _, answer in outcome)
    assert answered == 2 * sum(i * 1000 + k for i in range(64) for k in range(per_thread))
    batched = [item for batch in recorder.batches for item in batch]
    assert sorted(batched) == sorted(i * 1000 + k for i in range(64) for k in range(per_thread))  # each ran once
    assert max(len(b) for b in recorder.batches) <= 8
    assert any(len(b) > 1 for b in recorder.batches)  # concurrent requests really were gathered
    assert recorder.most_running == 1  # batches run one at a time, as in Cortex


def test_a_lone_request_is_answered_when_its_window_closes_not_later():
    batcher = Batcher(lambda items: [i + 1 for i in items], max_batch_size=4, interval_s=0.3)
    started = time.monotonic()
    assert batcher.submit(1) == 2
    elapsed = time.monotonic() - started
    # The window opens when the request arrives and closes `interval` later (the issue asks for ~interval).
    assert 0.3 <= elapsed < 1.3


def test_a_full_window_runs_at_once_without_waiting_for_the_interval():
    batcher = Batcher(lambda items: list(items), max_batch_size=4, interval_s=JOIN_TIMEOUT_S * 2)
    # Four callers fill the window: they are answered long before the minute-long interval.
    assert sorted(run_threads(4, lambda i: batcher.submit(i))) == [0, 1, 2, 3]


def test_a_short_list_fails_every_request_of_the_batch_and_hangs_none():
    batcher = Batcher(lambda items: items[:-1], max_batch_size=6, interval_s=0.05)

    outcomes = run_threads(6, lambda i: batcher.submit(i))

    assert all(isinstance(o, BatchFailed) for o in outcomes), outcomes
    assert "returned 5 results for a batch of 6" in outcomes[0].message
    assert len({id(o) for o in outcomes}) == 6  # each caller raises its own exception object


def test_a_long_list_fails_every_request_of_the_batch():
    batcher = Batcher(lambda items: [*items, "extra"], max_batch_size=3, interval_s=0.05)
    outcomes = run_threads(3, lambda i: batcher.submit(i))
    assert all(isinstance(o, BatchFailed) and "returned 4 results" in o.message for o in outcomes), outcomes


def test_a_result_that_is_not_a_list_fails_every_request_of_the_batch():
    batcher = Batcher(lambda items: {"merged": items}, max_batch_size=3, interval_s=0.05)
    outcomes = run_threads(3, lambda i: batcher.submit(i))
    assert all(isinstance(o, BatchFailed) and "returned a dict" in o.message for o in outcomes), outcomes


def test_a_raising_predict_fails_every_request_and_the_next_batch_still_runs():
    calls = []

    def flaky(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise ValueError("model exploded")
        return list(items)

    batcher = Batcher(flaky, max_batch_size=4, interval_s=0.05)
    outcomes = run_threads(4, lambda i: batcher.submit(i))
    assert all(isinstance(o, BatchFailed) for o in outcomes), outcomes
    assert all(isinstance(o.cause, ValueError) and "model exploded" in o.message for o in outcomes)
    assert batcher.submit(7) == 7


def test_a_request_past_its_deadline_when_the_batch_starts_is_left_out_of_it():
    recorder = Recorder()
    batcher = Batcher(recorder, max_batch_size=2, interval_s=0.2)
    past = time.time() - 1

    outcomes = run_threads(2, lambda i: batcher.submit(i, deadline=past if i == 0 else None))

    assert isinstance(outcomes[0], RequestTimeout)
    assert outcomes[1] == 2
    assert recorder.batches == [[1]]


def test_a_batch_whose_every_request_is_past_its_deadline_does_not_run():
    recorder = Recorder()
    batcher = Batcher(recorder, max_batch_size=3, interval_s=0.01)
    past = time.time() - 1
    outcomes = run_threads(3, lambda i: batcher.submit(i, deadline=past))
    assert all(isinstance(o, RequestTimeout) for o in outcomes), outcomes
    assert recorder.batches == []


def test_a_caller_never_waits_past_its_deadline_for_a_stuck_batch():
    release = threading.Event()
    entered = threading.Event()

    def stuck(items: list[int]) -> list[int]:
        entered.set()
        release.wait(JOIN_TIMEOUT_S)
        return list(items)

    batcher = Batcher(stuck, max_batch_size=2, interval_s=0.01, max_wait_s=0.2)
    try:
        # A first caller leads a batch that hangs in predict.
        leader = threading.Thread(target=batcher.submit, args=(0,), daemon=True)
        leader.start()
        entered.wait(JOIN_TIMEOUT_S)
        outcomes = run_threads(2, lambda i: batcher.submit(i, deadline=time.time() + 0.3 if i == 0 else None))
        # Two more fill the next window, whose run waits behind the stuck batch: the one with a
        # deadline gives up at it (504), the other at the batcher's cap (500).
        assert isinstance(outcomes[0], RequestTimeout)
        assert isinstance(outcomes[1], PredictorError) and not isinstance(outcomes[1], RequestTimeout)
    finally:
        release.set()


def test_a_predictor_with_server_side_batching_receives_aligned_lists_and_answers_each_request():
    seen: list[tuple[list, list, list]] = []

    class Batched:
        def predict(self, payload, query_params, headers):
            seen.append((payload, query_params, headers))
            return [f"{p['n']}:{q['tag']}:{h['x-caller']}"
                    for p, q, h in zip(payload, query_params, headers, strict=True)]

    predictor = RealtimePredictor(Batched(), batching=ServerSideBatching(max_batch_size=8, batch_interval=0.02))

    def caller(i: int) -> str:
        args = RequestArgs(payload={"n": i}, query_params={"tag": f"t{i}"}, headers={"x-caller": f"c{i}"},
                           request_id=f"r{i}")
        return predictor.predict(args)

    outcomes = run_threads(32, caller)

    assert outcomes == [f"{i}:t{i}:c{i}" for i in range(32)]
    assert all(len(p) == len(q) == len(h) <= 8 for p, q, h in seen)


def test_a_client_error_raised_by_a_batched_predict_keeps_its_cause():
    class Refuses:
        def predict(self, payload):
            raise ModelInputError("input 'x' must have 4 columns")

    predictor = RealtimePredictor(Refuses(), batching=ServerSideBatching(max_batch_size=2, batch_interval=0.01))
    with pytest.raises(BatchFailed) as caught:
        predictor.predict(RequestArgs(payload=[1]))
    assert isinstance(caught.value.cause, ModelInputError)


def test_batch_settings_are_checked():
    with pytest.raises(ValueError, match="max_batch_size must be at least 1"):
        Batcher(lambda items: items, max_batch_size=0, interval_s=0.1)
    with pytest.raises(ValueError, match="interval_s must be greater than 0"):
        Batcher(lambda items: items, max_batch_size=1, interval_s=0)


@pytest.mark.parametrize("predictor_type", ["python", "onnx"])
def test_python_and_onnx_predictors_with_server_side_batching_receive_lists(predictor_type):
    class Client:
        def gather(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("only a tensorflow predictor's client gathers its calls")

    class Batched:
        def predict(self, payload):
            assert isinstance(payload, list)
            return [p * 10 for p in payload]

    predictor = RealtimePredictor(Batched(), Client(), predictor_type=predictor_type,
                                  batching=ServerSideBatching(max_batch_size=4, batch_interval=JOIN_TIMEOUT_S))

    assert run_threads(4, lambda i: predictor.predict(RequestArgs(payload=i))) == [0, 10, 20, 30]
    assert predictor.batched and not predictor.gathers_client_calls


def test_a_tensorflow_predictor_with_server_side_batching_has_its_client_gather_its_calls():
    gathered: list[tuple[Any, ...]] = []

    class Client:
        def gather(self, max_batch_size: int, interval_s: float, **kwargs: Any) -> None:
            gathered.append((max_batch_size, interval_s, kwargs["on_run"]))

    class Single:
        def predict(self, payload):
            return {"one": payload}

    def on_batch(size: int) -> None:
        pass

    predictor = RealtimePredictor(Single(), Client(), predictor_type="tensorflow", on_batch=on_batch,
                                  batching=ServerSideBatching(max_batch_size=4, batch_interval=0.05))

    assert gathered == [(4, 0.05, on_batch)]
    assert predictor.predict(RequestArgs(payload={"n": 1})) == {"one": {"n": 1}}  # one payload, as on Cortex
    assert predictor.gathers_client_calls and not predictor.batched


def test_a_tensorflow_predictor_with_server_side_batching_but_no_client_fails_to_build():
    class Single:
        def predict(self, payload):
            return payload

    with pytest.raises(PredictorError, match="needs its model client"):
        RealtimePredictor(Single(), None, predictor_type="tensorflow",
                          batching=ServerSideBatching(max_batch_size=4, batch_interval=0.05))
