"""Server-side batching of a TensorFlow predictor: concurrent `tensorflow_client.predict` calls run as one.

On Cortex, `server_side_batching` left a `TensorFlowPredictor` unchanged: `predict` received one
payload and passed that request's input to `tensorflow_client.predict`, and TF Serving, below
it, gathered the calls reaching the model into one run along the model's batch dimension.
Sluice runs SavedModels in-process, so the gathering happens here, in the client: the calls of
one replica process are gathered by the same `Batcher` that hands a python predictor its lists
(a window opened by the first call, closed at `max_batch_size` calls or `batch_interval` after
it opened), and in each window the calls that can share a run are stacked along the first
dimension, run as one call of the signature, and handed back their own rows.

A call shares a run only with calls that resolved the same loaded model version (the one it
resolved stays its model, even if live reloading swaps "latest" meanwhile) and whose inputs have
the same dtypes and the same dimensions after the first. The answer is never traded for speed:
- a call that could never be stacked runs at once, alone, without waiting for a window: one
  for a signature with an input of unknown rank or of a fixed first dimension, or with an
  output that has no batch dimension (a scalar, a fixed first dimension); one whose inputs
  disagree on their number of rows; one of no rows;
- a run whose outputs do not all have as many rows as its inputs together is not split: each
  of its calls is run again alone, and the model version is no longer stacked;
- a run that raises is retried call by call, so that an error (the model rejecting one call's
  values) reaches only the call that caused it; when every call then succeeds alone, the model
  version evidently cannot take stacked inputs and is no longer stacked either.
What no check can see is a model whose rows are not independent (an output row that depends
on the other rows of the run, such as a softmax across the batch): such a model must not be
served with `server_side_batching`, as it could not be with TF Serving.

`max_batch_size` counts calls, not rows, as it counts requests for a python predictor: a
window's places are the requests waiting in it (`max_batch_size` cannot exceed
`threads_per_process`), and a call's rows are never split across runs. Cortex's own predictors
send one row per request, where the two counts agree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from predictors_runtime.batching import DEFAULT_MAX_WAIT_S, Batcher, request_deadline

from .onnx_client import InputSpec

if TYPE_CHECKING:
    from .tensorflow_client import TensorFlowModel

log = logging.getLogger("sluice.batching")

Outputs = dict[str, np.ndarray[Any, Any]]
# Runs a model version's signature on a feed of checked inputs: output name -> array.
RunSignature = Callable[["TensorFlowModel", dict[str, Any]], Outputs]


@dataclass
class Stacking:
    """Whether the calls of one loaded model version may be stacked into shared runs.

    Worked out from the signature when the version is loaded, and withdrawn (with the reason,
    logged once) when a run shows that the model's outputs or graph do not allow it.
    """

    possible: bool
    why_not: str = ""

    def withdraw(self, why: str, model_label: str) -> None:
        if self.possible:
            self.possible, self.why_not = False, why
            log.warning("server-side batching: the calls of %s are run one by one from now on: %s", model_label, why)


def signature_stacking(inputs: Sequence[InputSpec],
                       output_shapes: dict[str, tuple[int | None, ...] | None]) -> Stacking:
    """Whether a signature's calls can be stacked along its first dimension, from its declared shapes.

    Every input needs a known rank of at least one and a first dimension of any size (the batch
    dimension); every output whose shape is declared needs a first dimension of any size too
    (a scalar or an output of fixed length cannot hold one row per input row).
    """
    if not inputs:
        return Stacking(False, "the signature takes no inputs")
    for spec in inputs:
        if spec.dtype is None:
            return Stacking(False, f"input {spec.name!r} is not a tensor of numbers or strings")
        if not spec.shape:
            return Stacking(False, f"input {spec.name!r} has no batch dimension (its shape is "
                                   f"{'unknown' if spec.shape is None else 'a scalar'})")
        if spec.shape[0] is not None:
            return Stacking(False, f"input {spec.name!r} has a fixed first dimension ({spec.shape[0]})")
    for name, shape in sorted(output_shapes.items()):
        if shape is None:
            continue  # unknown rank: checked on each run
        if not shape or shape[0] is not None:
            return Stacking(False, f"output {name!r} has no batch dimension (shape {list(shape)})")
    return Stacking(True)


@dataclass(frozen=True, eq=False)
class _Call:
    """One `predict` call, its inputs checked and converted, with the model version it resolved."""

    model: TensorFlowModel  # the loaded version this call resolved: the one it runs on
    feed: dict[str, Any]
    rows: int
    key: Hashable  # calls with equal keys may share a run


class _Raised:
    """A call's outcome when its run raised: re-raised in the caller's own thread."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _rows_and_shape(feed: dict[str, Any]) -> tuple[int, Hashable] | None:
    """(row count, what another call must match to be stacked with it), or None if it cannot be."""
    rows: int | None = None
    shape: list[tuple[str, str, tuple[int, ...]]] = []
    for name, value in sorted(feed.items()):
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            return None
        if rows is None:
            rows = value.shape[0]
        elif value.shape[0] != rows:
            return None
        shape.append((name, value.dtype.str, value.shape[1:]))
    if not rows:  # no inputs, or no rows: nothing to gain, and an empty run is the model's own business
        return None
    return rows, tuple(shape)


class CallGatherer:
    """Gathers concurrent calls of `run(model, feed)` into shared runs; each call gets its own rows.

    `predict(model, feed)` blocks its caller until its outputs are known and returns
    them, or raises what its own run raised (`ModelInputError` for values the model rejected),
    or the `Batcher`'s errors when the window itself failed (`RequestTimeout` past the
    request's deadline, `batching.request_deadline`). `on_run(calls)` is told how many calls
    each run of the signature served, for the replica's figures.
    """

    def __init__(self, run: RunSignature, max_batch_size: int, interval_s: float, *,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S, on_run: Callable[[int], None] | None = None) -> None:
        self._run = run
        self._on_run = on_run
        self._batcher: Batcher[_Call] = Batcher(self._run_window, max_batch_size, interval_s, max_wait_s=max_wait_s)

    def predict(self, model: TensorFlowModel, feed: dict[str, Any]) -> Outputs:
        """The outputs of `model`'s signature for this call's `feed` (checked inputs), from a shared run if it can."""
        found = _rows_and_shape(feed) if model.stacking.possible else None
        if found is None:
            return self._alone(model, feed)
        rows, shape = found
        outcome = self._batcher.submit(_Call(model, feed, rows, (id(model), shape)), request_deadline.get())
        if isinstance(outcome, _Raised):
            raise outcome.error
        result: Outputs = outcome
        return result

    def _alone(self, model: TensorFlowModel, feed: dict[str, Any]) -> Outputs:
        if self._on_run is not None:
            self._on_run(1)
        return self._run(model, feed)

    # --- on the thread that leads a window -----------------------------------------------------

    def _run_window(self, calls: list[_Call]) -> list[Any]:
        """One outcome per call: its outputs or `_Raised`; never raises for a call's own failure."""
        groups: dict[Hashable, list[int]] = {}
        for index, call in enumerate(calls):
            groups.setdefault(call.key, []).append(index)
        outcomes: list[Any] = [None] * len(calls)
        for members in groups.values():
            for index, outcome in zip(members, self._run_group([calls[i] for i in members]), strict=False):
                outcomes[index] = outcome
        return outcomes

    def _run_group(self, calls: list[_Call]) -> list[Any]:
        """Run calls of one model version and input shape as one run, or one by one when they cannot share it."""
        first = calls[0]
        if len(calls) == 1 or not first.model.stacking.possible:
            return [self._outcome_alone(call) for call in calls]
        total = sum(call.rows for call in calls)
        feed = {name: np.concatenate([call.feed[name] for call in calls]) for name in first.feed}
        if self._on_run is not None:
            self._on_run(len(calls))
        try:
            outputs = self._run(first.model, feed)
        except Exception as e:  # noqa: BLE001 - each call is retried alone and gets its own outcome
            log.info("server-side batching: a run of %d calls raised %s; running them one by one",
                     len(calls), type(e).__name__)
            outcomes = [self._outcome_alone(call) for call in calls]
            if not any(isinstance(o, _Raised) for o in outcomes):
                first.model.stacking.withdraw(
                    f"a run of {len(calls)} stacked calls raised {type(e).__name__}: {e}, while each call "
                    "alone succeeded", first.model.source)
            return outcomes
        uneven = sorted(name for name, value in outputs.items()
                        if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[0] != total)
        if uneven:
            first.model.stacking.withdraw(
                f"output {uneven[0]!r} did not have one row per input row (a run of {total} rows answered shape "
                f"{list(np.shape(outputs[uneven[0]]))})", first.model.source)
            return [self._outcome_alone(call) for call in calls]
        bounds = np.cumsum([call.rows for call in calls])[:-1]
        pieces = {name: np.split(value, bounds) for name, value in outputs.items()}
        return [{name: pieces[name][i] for name in outputs} for i in range(len(calls))]

    def _outcome_alone(self, call: _Call) -> Any:
        try:
            return self._alone(call.model, call.feed)
        except Exception as e:  # noqa: BLE001 - raised in the caller's thread
            return _Raised(e)
