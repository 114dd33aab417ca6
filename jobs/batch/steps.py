"""The run of one batch as a short pipeline of small steps, one concern each, as dramatiq's middleware are.

A step is called with the batch's `BatchRun` and the rest of the pipeline (`call_next`): it may
act before, call the rest once, several times (retries: once per try) or not at all (a batch
that must not run), and act after. Outermost first:

- `Labels`: log lines carry the job and batch, and go to the job's log stream too;
- `OpenDelivery`: a delivery entered in its node's in-flight hash but never recorded (its job
  ended) is taken off it;
- `Figures`: a recorded batch is counted (batches, items, seconds) in this process's figures;
- `Record`: the outcome the inner steps decided is recorded once, and the recording that
  completes the job sends its completion task (on a node, once the answer arrives: the node
  takes its next message meanwhile);
- `Begin`: the delivery is counted; a batch of an ended job, one already recorded, or one whose
  process died too often does not run (the batch's input is read while Redis answers);
- `BuildPredictor`: the job's predictor in this process (a failure fails the job);
- `ReadInput`: the items of a batch carried by reference are read from storage, or the batch
  fails for what could not be read;
- `TimeLimit`: tries an earlier delivery used up by the batch time limit count;
- `Retries`: each remaining try runs the rest under the time limit, until one succeeds;
- `Outputs`: the rows a try returned are written as the job's output part;
- `predict`: the user's predictor.

The runner builds the pipeline once per process (`batch_pipeline`); a new concern is one more
step, not a branch inside the worker loop. Each step is given only the collaborators it uses (the
batch ledger, the job records, the node registry, placement, the process's job predictors, its
watchdog, figures and log capture, the function that sends a completion); none calls back into the
runner that built it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeVar

from foundation.errors import PredictorError, SluiceError
from foundation.figure_sink import FigureSink
from foundation.figures import BATCH_SECONDS, BATCHES, ITEMS
from foundation.json_logs import labelled
from jobs.batch.inputs import read_range
from jobs.batch.job import ACTIVE_STATUSES, Job, JobStatus
from jobs.batch.outputs import write_part
from jobs.batch.predictors import JobPredictor, JobPredictors
from jobs.batch.publish import SendCompletion
from jobs.batch.time_limit import BatchWatchdog, timed_out_message
from jobs.nodes.compute_cap import ComputeCap
from jobs.nodes.registry import NodeRegistry
from jobs.placement.batch import JobPlacement
from jobs.store import BatchLedger, JobRecords, Recorded
from jobs.store.answers import Answer
from jobs.transport.batch_strategy import HandedBack
from jobs.transport.delivery import Delivery
from predictors_runtime.loader import error_text

log = logging.getLogger(__name__)

T = TypeVar("T")

# Deliveries of one batch beyond its tries before Sluice stops handing it to workers: each
# such delivery means the process running it died (killed, or out of memory).
LOST_DELIVERY_ALLOWANCE = 2


def batch_id_of(job_id: str, index: int) -> str:
    """A uuid for a batch, stable across redeliveries so a predictor's outputs stay idempotent."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sluice:{job_id}:{index}"))


def items_of(payload: Any, payload_ref: dict[str, Any] | None = None) -> int:
    """How many items a batch holds: its payload's length, or the line count its storage range was cut with."""
    if isinstance(payload, list):
        return len(payload)
    if payload_ref is not None:
        return int(payload_ref.get("lines", 0))
    return 0 if payload is None else 1


@dataclass(frozen=True)
class Outcome:
    """What is to be recorded of a batch."""

    ok: bool
    items: int
    error: str = ""
    tries: int = 0
    # Seconds its tries ran; None for a batch that never ran (left out of the duration figure).
    seconds: float | None = None
    # Kept with a failed batch for inspection and retries: its items, or where they live.
    payload: Any = None
    payload_ref: dict[str, Any] | None = None


@dataclass
class BatchRun:
    """One delivery of one batch, as it passes through the steps."""

    job_id: str
    index: int
    payload: Any
    payload_ref: dict[str, Any] | None
    delivery: Delivery | None
    job: Job | None = None
    predictor: JobPredictor | None = None
    open_delivery: Delivery | None = None  # in its node's in-flight hash and not recorded yet
    timed_out_tries: int = 0  # tries earlier deliveries used up by the time limit, as `Begin` read them
    first_try: int = 1
    input_read: bool = False  # the items of a batch carried by reference were read (`ReadInput.read`)
    input_error: str = ""  # why they could not be
    result: Any = None
    outcome: Outcome | None = None
    recorded: Recorded | None = None
    # Called once the outcome is recorded, which may be after the task returned (`Record`).
    when_recorded: list[Callable[[BatchRun], None]] = field(default_factory=list)


Next = Callable[[BatchRun], None]
Step = Callable[[BatchRun, Next], None]


class LaterAnswers(Protocol):
    """Where a store answer can be left to be used once it arrives (`jobs/nodes/loop_answers.py`)."""

    def later(self, answer: Answer[T], use: Callable[[T], None]) -> bool:
        """Leave `answer` to `use` once it has arrived; False when it cannot be left here (use it now)."""


class JobLogs(Protocol):
    """Where a job's log lines also go (`foundation.log_streams.StreamLogHandler`)."""

    def capturing_job(self, job_id: str) -> AbstractContextManager[None]:
        """The lines this thread logs inside the block go to the job's log stream too."""


def chain(steps: Sequence[Step]) -> Next:
    """The steps as one callable: each gets the run and the rest of the chain."""

    def call(position: int, run: BatchRun) -> None:
        if position < len(steps):
            steps[position](run, lambda inner: call(position + 1, inner))

    return lambda run: call(0, run)


class Labels:
    """Log lines name the job and batch, and are also captured into the job's log stream."""

    def __init__(self, logs: JobLogs) -> None:
        self.logs = logs

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        with labelled(job_id=run.job_id, batch_index=str(run.index)), self.logs.capturing_job(run.job_id):
            call_next(run)


class OpenDelivery:
    """A delivery entered in flight but not recorded (its job ended meanwhile) leaves its node's hash."""

    def __init__(self, nodes: NodeRegistry) -> None:
        self.nodes = nodes

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        try:
            call_next(run)
        except HandedBack:  # a cold shutdown: left in flight, so that the node's next life gives it back at once
            run.open_delivery = None
            raise
        finally:
            if run.open_delivery is not None:
                self.nodes.end_delivery(run.open_delivery)
                run.open_delivery = None


class Figures:
    """A recorded batch counts in the figures (a duplicate does not: figures count what the store counts)."""

    def __init__(self, figures: FigureSink) -> None:
        self.figures = figures

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        run.when_recorded.append(self._count)
        call_next(run)

    def _count(self, run: BatchRun) -> None:
        outcome = run.outcome
        if not run.recorded or outcome is None or run.job is None:
            return
        api = run.job.api_name
        self.figures.count(BATCHES.name, (api, "succeeded" if outcome.ok else "failed"))
        self.figures.count(ITEMS.name, (api,), outcome.items)
        if outcome.seconds is not None:
            self.figures.observe(BATCH_SECONDS.name, (api,), outcome.seconds)


class Record:
    """Record the outcome the inner steps decided, exactly once; the last batch sends the completion.

    A success is sent to the store and its answer left to `answers` (`jobs/nodes/loop_answers.py`:
    on a node, used when its event loop sees it, while the node takes its next message): what the
    answer decides (the completion, `BatchRun.when_recorded`) waits for it, nothing else does. A
    failure carries its payload and is rare: it is waited for.
    """

    def __init__(self, ledger: BatchLedger, send_completion: SendCompletion, answers: LaterAnswers) -> None:
        self.ledger = ledger
        self.send_completion = send_completion
        self.answers = answers

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        call_next(run)
        outcome, job = run.outcome, run.job
        if outcome is None or job is None:
            return  # the batch did not run (its job ended, or it was recorded already)
        store, seconds = self.ledger, outcome.seconds or 0.0
        if outcome.ok:
            sent = store.send_record_success(run.job_id, run.index, seconds, run.delivery)
            run.open_delivery = None  # the recording takes it off the node's in-flight hash
            use = partial(self._recorded, run, job)
            if not self.answers.later(sent, use):
                use(sent.answer())
            return
        recorded = store.record_failure(
            run.job_id, run.index, seconds, outcome.error, outcome.tries, outcome.payload, outcome.payload_ref,
            delivery=run.delivery,
        )
        run.open_delivery = None  # recording took it off the node's in-flight hash
        self._recorded(run, job, recorded)

    def _recorded(self, run: BatchRun, job: Job, recorded: Recorded) -> None:
        run.recorded = recorded
        if recorded is Recorded.COMPLETED_JOB:
            self.send_completion(job.job_id, job.queue)
        for then in run.when_recorded:
            then(run)


class Begin:
    """Count the delivery; run nothing of an ended job, or of a batch recorded already, or one whose
    process died more often than its tries allow."""

    def __init__(self, ledger: BatchLedger, predictors: JobPredictors, meanwhile: Callable[[BatchRun], None]) -> None:
        """`meanwhile(run)` is done while the begin is on its way (`BatchLedger.send_begin_batch`): work
        without effects whose result the batch uses only if it runs (reading its input)."""
        self.ledger = ledger
        self.predictors = predictors
        self.meanwhile = meanwhile

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        sent = self.ledger.send_begin_batch(run.job_id, run.index, run.delivery)
        try:
            self.meanwhile(run)
        finally:
            start = sent.answer()
        if start.status is None or start.status not in ACTIVE_STATUSES:
            return  # unknown, stopped, timed out or failed job: nothing more runs
        if start.already_recorded:
            log.info("job %s batch %d was already recorded; skipping a duplicate delivery", run.job_id, run.index)
            return
        run.open_delivery = run.delivery
        run.timed_out_tries = start.timed_out_tries
        self.predictors.sweep(run.job_id, time.monotonic())
        run.job = job = self.predictors.job(run.job_id)
        if start.deliveries > job.tries + LOST_DELIVERY_ALLOWANCE:
            run.outcome = Outcome(
                ok=False, items=items_of(run.payload, run.payload_ref), tries=start.deliveries - 1,
                error=f"the worker process running this batch died {start.deliveries - 1} times "
                      "(killed, or out of memory)",
                payload=run.payload,
            )
            return
        call_next(run)


class BuildPredictor:
    """The job's predictor in this process; one that cannot be built fails the job (its nodes let go,
    and what this process holds of it dropped)."""

    def __init__(
        self, predictors: JobPredictors, watchdog: BatchWatchdog, records: JobRecords, placement: JobPlacement,
        compute_cap: ComputeCap | None = None,
    ) -> None:
        self.predictors = predictors
        self.watchdog = watchdog
        self.records = records
        self.placement = placement
        self.compute_cap = compute_cap

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        job = _job_of(run)
        if self.compute_cap is not None:  # the node's limit and weight are this job's before its predictor runs
            self.compute_cap.require_compute(job.api_spec.get("compute"))
        try:
            with self.watchdog.while_active(job, run.index):
                run.predictor = self.predictors.predictor_for(job, run.delivery.node if run.delivery else None)
        except PredictorError as e:
            if self.records.transition(job.job_id, JobStatus.WORKER_ERROR, message=e.message):
                log.error("job %s: %s: %s", job.job_id, JobStatus.WORKER_ERROR.value, e.message)
                self.placement.release(job)
            self.predictors.forget(job.job_id)
            return
        call_next(run)


class ReadInput:
    """A batch carried by reference (a JSON-lines byte range) has its items read from storage.

    `Begin` has them read (`read`) while the batch's begin is on its way; what failed to be read
    fails the batch only here, once it is known to run and its predictor was built."""

    def __init__(self, local_roots: tuple[str, ...]) -> None:
        self.local_roots = local_roots

    def read(self, run: BatchRun) -> None:
        if run.payload_ref is None or run.input_read:
            return
        run.input_read = True
        try:
            run.payload = read_range(run.payload_ref, self.local_roots)
        except (SluiceError, OSError, ValueError) as e:  # storage (its errors are Sluice's) went away, a
            # local file is gone (OSError), or its lines are no longer the JSON that was cut (ValueError)
            run.input_error = f"reading the batch's input failed: {error_text(e)}"

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        self.read(run)
        if run.input_error:
            run.outcome = Outcome(ok=False, items=items_of(None, run.payload_ref), tries=1, error=run.input_error,
                                  payload_ref=run.payload_ref)
            return
        call_next(run)


class TimeLimit:
    """Tries that earlier deliveries used up by running past the batch time limit count (read by the
    batch's begin, in the same round trip)."""

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        job = _job_of(run)
        timed_out = run.timed_out_tries if job.batch_timeout is not None else 0
        if timed_out >= job.tries:
            run.outcome = Outcome(
                ok=False, items=items_of(run.payload, run.payload_ref), tries=job.tries,
                error=timed_out_message(job.batch_timeout), payload=run.payload, payload_ref=run.payload_ref,
            )
            return
        run.first_try = timed_out + 1
        call_next(run)


class Retries:
    """Each try left runs the rest of the pipeline under the time limit, until one succeeds."""

    def __init__(self, watchdog: BatchWatchdog) -> None:
        self.watchdog = watchdog

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        job = _job_of(run)
        began = time.perf_counter()
        error = ""
        for attempt in range(run.first_try, job.tries + 1):
            try:
                with self.watchdog.running(job, run.index, attempt, run.payload, run.payload_ref):
                    call_next(run)
            except Exception as e:  # noqa: BLE001 - last-resort boundary: the user's code may raise anything; retry, then
                # keep the batch as failed
                error = error_text(e)
                log.warning("job %s batch %d try %d/%d failed: %s", run.job_id, run.index, attempt, job.tries, e)
                continue
            run.outcome = Outcome(ok=True, items=items_of(run.payload), tries=attempt,
                                  seconds=time.perf_counter() - began)
            return
        run.outcome = Outcome(ok=False, items=items_of(run.payload), tries=job.tries, error=error,
                              seconds=time.perf_counter() - began, payload=run.payload)


class Outputs:
    """The rows a try returned are written as the job's output part (a failure to write fails the try)."""

    def __init__(self, ledger: BatchLedger, local_roots: tuple[str, ...]) -> None:
        self.ledger = ledger
        self.local_roots = local_roots

    def __call__(self, run: BatchRun, call_next: Next) -> None:
        call_next(run)
        job = _job_of(run)
        if job.output is not None and isinstance(run.result, list):
            rows = write_part(job.output, run.job_id, run.index, run.result, local_roots=self.local_roots)
            self.ledger.record_part(run.job_id, run.index, rows)


def predict(run: BatchRun, call_next: Next) -> None:
    """The user's predictor, on the batch's items."""
    if run.predictor is None:  # `BuildPredictor` sets it; a step placed before it is a programming error
        raise RuntimeError("a batch was predicted before its job's predictor was built")
    run.result = run.predictor.predict(run.payload, batch_id_of(run.job_id, run.index))
    call_next(run)


def _job_of(run: BatchRun) -> Job:
    if run.job is None:  # `Begin` sets it; a step placed before it is a programming error
        raise RuntimeError("a batch step ran before the batch's job was read")
    return run.job


def batch_pipeline(
    *, ledger: BatchLedger, records: JobRecords, nodes: NodeRegistry, placement: JobPlacement,
    predictors: JobPredictors, watchdog: BatchWatchdog, figures: FigureSink, logs: JobLogs,
    send_completion: SendCompletion, local_roots: tuple[str, ...], answers: LaterAnswers,
    compute_cap: ComputeCap | None = None,
) -> Next:
    """The steps a batch goes through in this process, outermost first, each given what it uses;
    `answers` may hold the answers of batch records until they arrive; `compute_cap` is the node's
    memory limit and CPU weight, set for each batch's job."""
    read_input = ReadInput(local_roots)
    return chain([
        Labels(logs), OpenDelivery(nodes), Figures(figures),
        Record(ledger, send_completion, answers),
        Begin(ledger, predictors, meanwhile=read_input.read),
        BuildPredictor(predictors, watchdog, records, placement, compute_cap),
        read_input, TimeLimit(), Retries(watchdog), Outputs(ledger, local_roots), predict,
    ])
