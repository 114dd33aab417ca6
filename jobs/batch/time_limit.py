"""The batch time limit (`batch_timeout`), and the end of batches whose job has ended.

A node runs its batches in its main thread (Celery's solo pool), and Python cannot stop a thread
stuck in user code: a C call, a lock, a socket read without a timeout. So a node stops such a
batch by ending its own process, from a watchdog thread: past the limit it records the try as
failed ("timed out after N s"; on the batch's last try the batch itself is recorded as failed, so
the job goes on), then calls `os._exit`. The process's supervisor (the embedded stack, docker's
restart policy) starts the node again, and the new process first gives back what the old one
held (`jobs/transport/settle.py`): the batch returns to its job's queue for its next try, counted from
the tries recorded here. The watchdog also watches the job itself while a batch runs: a job that
times out or is stopped ends its in-flight batches the same way, so a hung predictor never keeps
a node from the next job.

A predictor that holds the GIL (a C extension looping without releasing it) starves the watchdog
thread too; for that case the kernel ends the process: SIGALRM, left at its default action, is
armed for `SLUICE_HARD_STOP_GRACE_S` (default 5) past the limit. Such a try is not recorded as
timed out; the batch's next delivery counts it as a lost one (see `LOST_DELIVERY_ALLOWANCE` in `jobs/batch/steps.py`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import redis

from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.publish import SendCompletion
from jobs.store import BatchLedger, JobRecords, Recorded

log = logging.getLogger(__name__)

# Exit status of a node ended by its watchdog ("temporary failure, try again": restart it).
EXIT_STOPPED_BATCH = 75
# How often a running batch's job status is read: a stopped or timed-out job frees its nodes
# within this. Batches shorter than this never read it.
STATUS_POLL_S = 0.5


def batch_time_limit(requested: float | None, api_spec: dict[str, Any], settings: Settings) -> float | None:
    """The limit a new job's batches run under: the job's own, else its API's, else Sluice's default."""
    if requested is not None:
        return float(requested)
    api_default = (api_spec.get("predictor") or {}).get("batch_timeout")
    if api_default is not None:
        return float(api_default)
    return settings.batch_timeout_s


def timed_out_message(limit: float | None) -> str:
    return f"timed out after {limit:g} s" if limit is not None else "timed out"


@contextmanager
def hook_time_limit(limit: float | None, on_expiry: Callable[[], Any],
                    end_process: Callable[[int], Any] = os._exit) -> Iterator[None]:
    """Run the block (a job's `on_job_complete`) for at most `limit` seconds (None: no limit).

    Past the limit a watchdog thread calls `on_expiry` (which records the job's outcome) and ends
    the process, as for a batch: the node's supervisor starts it again and a hung hook never keeps
    a node from the next job.
    """
    if limit is None:
        yield
        return
    finished = threading.Event()

    def watch() -> None:
        if finished.wait(limit):
            return
        try:
            on_expiry()
        except Exception:
            log.exception("recording the timed-out on_job_complete failed")
        end_process(EXIT_STOPPED_BATCH)

    thread = threading.Thread(target=watch, name="sluice-hook-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        finished.set()


def arm_hard_stop(limit: float | None, grace_s: float | None) -> bool:
    """Have the kernel end this process `grace_s` past `limit` (SIGALRM, left at its default action):
    what stops a predictor that holds the GIL, which the watchdog thread cannot. Armed only in the
    main thread, and only if nobody installed a handler for SIGALRM; True when armed (disarm with
    `signal.alarm(0)`)."""
    if limit is None or grace_s is None:
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None):
        return False
    signal.alarm(math.ceil(limit + grace_s))
    return True


@contextmanager
def hard_stop(limit: float | None, grace_s: float | None) -> Iterator[None]:
    """The block runs with the kernel's hard stop armed (`arm_hard_stop`), disarmed after it."""
    armed = arm_hard_stop(limit, grace_s)
    try:
        yield
    finally:
        if armed:
            signal.alarm(0)


@dataclass(frozen=True)
class _Watch:
    """What the node's main thread is running now."""

    job: Job
    index: int
    attempt: int  # 0 while the job's predictor is being built
    payload: Any
    payload_ref: dict[str, Any] | None
    deadline: float | None  # time.monotonic(); None: no limit, only the job's status is watched
    limit: float | None
    first_poll: float = math.inf  # time.monotonic() of the job's first status read for this watch


class BatchWatchdog:
    """One per node process: ends the process when the batch it runs must stop."""

    def __init__(
        self, records: JobRecords, ledger: BatchLedger, send_completion: SendCompletion,
        status_poll_s: float = STATUS_POLL_S, end_process: Callable[[int], Any] = os._exit,
        hard_stop_grace_s: float | None = None,
    ) -> None:
        """`records`: the job's status is watched there; `ledger`: a timed-out try is counted there, and
        a last one recorded (with `send_completion` for a job it completes); `hard_stop_grace_s`:
        seconds past the limit the kernel ends the process (None: never)."""
        self._records = records
        self._ledger = ledger
        self._send_completion = send_completion
        self._status_poll_s = status_poll_s
        self._end_process = end_process
        self._hard_stop_grace_s = hard_stop_grace_s
        self._cond = threading.Condition()
        self._watch: _Watch | None = None
        self._thread: threading.Thread | None = None
        # When the watchdog thread wakes next by itself (time.monotonic()): a watch due no earlier
        # needs no notify, so a node running batch after batch does not wake the thread for each.
        self._wake_at = math.inf

    def tries_timed_out(self, job: Job, index: int) -> int:
        """Tries of this batch used up by the time limit in earlier deliveries."""
        return self._ledger.timed_out_tries(job.job_id, index) if job.batch_timeout is not None else 0

    @contextmanager
    def running(
        self, job: Job, index: int, attempt: int, payload: Any, payload_ref: dict[str, Any] | None = None
    ) -> Iterator[None]:
        """Try `attempt` of a batch runs inside: under the job's limit, and only while the job is active."""
        limit = job.batch_timeout
        deadline = time.monotonic() + limit if limit is not None else None
        with hard_stop(limit, self._hard_stop_grace_s), \
                self._watching(_Watch(job, index, attempt, payload, payload_ref, deadline, limit,
                                      time.monotonic() + self._status_poll_s)):
            yield

    @contextmanager
    def while_active(self, job: Job, index: int) -> Iterator[None]:
        """Work for a batch without a time limit (building the job's predictor): ended if the job ends."""
        with self._watching(_Watch(job, index, 0, None, None, None, None, time.monotonic() + self._status_poll_s)):
            yield

    # -- the watchdog thread ----------------------------------------------------------------
    @contextmanager
    def _watching(self, watch: _Watch) -> Iterator[None]:
        """The thread is woken only when the watch is due before the thread wakes by itself; when
        the watch ends the thread is not woken at all: at its next wake it finds none (or the next)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sluice-batch-watchdog", daemon=True)
                self._thread.start()
            self._watch = watch
            if min(watch.first_poll, watch.deadline or math.inf) < self._wake_at:
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._watch = None

    def _run(self) -> None:
        try:
            self._watch_batches()
        finally:  # only reached where ending the process was stubbed out (tests): watch again on the next batch
            with self._cond:
                self._thread = None

    def _watch_batches(self) -> None:
        watch: _Watch | None = None
        next_poll = 0.0
        while True:
            with self._cond:
                if self._watch is not watch:  # a new batch (or none): its first status read comes later
                    watch = self._watch
                    next_poll = watch.first_poll if watch is not None else math.inf
                now = time.monotonic()
                if watch is None:  # nothing to watch: wake once a poll period, so a watch due later needs no notify
                    self._wait_until(now + self._status_poll_s, now)
                    continue
                if watch.deadline is not None and now >= watch.deadline:
                    self._time_out(watch)  # holding the lock: the batch cannot be recorded meanwhile
                    return
                due = next_poll if watch.deadline is None else min(next_poll, watch.deadline)
                if due > now:
                    self._wait_until(due, now)
                    continue
            status = self._job_status(watch)
            next_poll = time.monotonic() + self._status_poll_s
            if status is not None and not status.is_terminal:
                continue
            with self._cond:
                if self._watch is watch:
                    self._job_ended(watch, status)
                    return

    def _wait_until(self, due: float, now: float) -> None:
        """Wait (holding the condition) until `due`, or a notify for a watch due sooner."""
        self._wake_at = due
        self._cond.wait(due - now)
        self._wake_at = math.inf  # awake: a watch set meanwhile is looked at before the next wait

    def _job_status(self, watch: _Watch) -> JobStatus | None:
        try:
            return self._records.status(watch.job.job_id)
        except redis.RedisError as e:  # Redis away for a moment: the job is read again next poll
            log.warning("reading the status of job %s failed: %s", watch.job.job_id, e)
            return JobStatus.RUNNING

    def _time_out(self, watch: _Watch) -> None:
        job, index, message = watch.job, watch.index, timed_out_message(watch.limit)
        last = watch.attempt >= job.tries
        log.error(
            "job %s batch %d try %d/%d %s; ending this node's process to stop it%s",
            job.job_id, index, watch.attempt, job.tries, message, "" if last else " (the batch will be tried again)",
        )
        try:
            self._ledger.mark_timed_out(job.job_id, index, watch.attempt)
            if last:
                self._record_failure(watch, message)
        except redis.RedisError as e:  # the batch's next delivery sees its tries as they were
            log.error("recording the timed-out try of job %s batch %d failed: %s", job.job_id, index, e)
        self._exit()

    def _record_failure(self, watch: _Watch, message: str) -> None:
        """The batch's last try timed out: it is failed now, so its job goes on while this node restarts.

        Recorded without the delivery: the node's in-flight entry stays, so the new process gives the
        message back and its next delivery, seeing the batch recorded, is acknowledged.
        """
        job = watch.job
        recorded = self._ledger.record_failure(
            job.job_id, watch.index, watch.limit or 0.0, message, job.tries, watch.payload, watch.payload_ref,
        )
        if recorded is Recorded.COMPLETED_JOB:
            self._send_completion(job.job_id, job.queue)

    def _job_ended(self, watch: _Watch, status: JobStatus | None) -> None:
        job = watch.job
        log.warning(
            "job %s is %s while its batch %d runs here; ending this node's process to stop it",
            job.job_id, status.value if status else "gone", watch.index,
        )
        self._exit()

    def _exit(self) -> None:
        with suppress(OSError, ValueError):
            sys.stderr.flush()
        self._end_process(EXIT_STOPPED_BATCH)
