"""What a worker process does with a batch and with a job's completion.

`WorkerRuntime` is assembled once per process (`jobs/wiring.py`) from its `Services`: the job
predictors it keeps (`jobs/batch/predictors.py`), the batch pipeline (`jobs/batch/steps.py`) and the
completion (`jobs/batch/completion.py`), each given the collaborators it uses. `jobs/tasks.py` only wraps
`run_batch` and `finish_job`. A batch's errors are caught and recorded in its pipeline and the task
returns normally, so a Celery retry never runs a batch behind Sluice's back; the recording of the
job's last batch sends its completion task (see `jobs/batch/publish.py`).

Nothing here is called back by what it assembled: the arrows go from the runner down.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from foundation import figure_sink as process_figures
from foundation.api_registry import RedisApiRegistry
from foundation.environment_states import RedisEnvironmentStates
from foundation.figure_sink import FigureSink
from foundation.figures import Recorder
from foundation.json_logs import labelled
from foundation.log_streams import install_job_log_handler
from foundation.predictor_builds import RedisPredictorBuilds
from jobs.asyncapi.runner import AsyncPredictors, AsyncRuntime, BundleAsyncBuilder
from jobs.asyncapi.submit import send_queued_task
from jobs.batch.completion import JobCompletion
from jobs.batch.predictors import BundlePredictors, JobPredictors
from jobs.batch.publish import completion_sender
from jobs.batch.steps import LOST_DELIVERY_ALLOWANCE, BatchRun, JobLogs, batch_id_of, batch_pipeline
from jobs.batch.time_limit import BatchWatchdog
from jobs.nodes.compute_cap import ComputeCap
from jobs.nodes.loop_answers import NODE_LOOP, LoopAnswers
from jobs.services import Services
from jobs.transport.delivery import Delivery
from predictors_runtime.environments import HostEnvironments

__all__ = ["LOST_DELIVERY_ALLOWANCE", "WorkerRuntime", "batch_id_of"]

log = logging.getLogger(__name__)


class WorkerLogs(JobLogs, Protocol):
    """Where a job's, and an AsyncAPI request's, log lines also go (`foundation.log_streams.StreamLogHandler`)."""

    def capturing_request(self, api_name: str, request_id: str) -> AbstractContextManager[None]:
        """The lines this thread logs inside the block go to the request's log stream and its API's too."""

    def capturing_requests(self, api_name: str, request_ids: Sequence[str]) -> AbstractContextManager[None]:
        """... to every one of these requests' streams and their API's (a batch of them: one `predict`)."""


class WorkerRuntime:
    """Per process: one predictor per job, built on first use and kept for the job; the batch
    pipeline and the completion over them."""

    def __init__(
        self, services: Services, *, figures: FigureSink, logs: WorkerLogs, predictors: JobPredictors | None = None,
        end_process: Callable[[int], Any] = os._exit, answers: LoopAnswers | None = None,
    ) -> None:
        """`figures` count batches, `logs` capture a job's lines into its stream; `predictors` (built
        from the jobs' bundles unless given) and `end_process` (how the watchdog stops a batch) are
        given by fast tests; `answers` uses the answers of batch records (a node's event loop's; at
        once unless given)."""
        settings = services.settings
        self.answers = answers if answers is not None else LoopAnswers()
        environments = HostEnvironments.under(settings.cache_dir, events=RedisEnvironmentStates(services.redis))
        outcomes = RedisPredictorBuilds(services.redis)
        self.predictors = predictors if predictors is not None else JobPredictors(
            services.store, BundlePredictors(services.bundles, settings, environments), outcomes)
        self.logs = logs
        send_completion = completion_sender(services.celery)
        self.watchdog = BatchWatchdog(services.store, services.store, send_completion, end_process=end_process,
                                      hard_stop_grace_s=settings.hard_stop_grace_s)
        self._run = batch_pipeline(
            ledger=services.store, records=services.store, nodes=services.nodes, placement=services.placement,
            predictors=self.predictors, watchdog=self.watchdog, figures=figures, logs=logs,
            send_completion=send_completion, local_roots=settings.local_input_roots, answers=self.answers,
            compute_cap=ComputeCap.from_env(),
        )
        self.completion = JobCompletion(services.store, services.nodes, services.placement, self.predictors,
                                        settings.local_input_roots)
        self.requests = AsyncRuntime(
            services.async_requests, services.request_objects, RedisApiRegistry(services.redis), services.nodes,
            AsyncPredictors(BundleAsyncBuilder(services.bundles, settings, environments), outcomes),
            end_process=end_process,
            hard_stop_grace_s=settings.hard_stop_grace_s,
            wake=lambda api_name: send_queued_task(services.celery, api_name, services.async_requests,
                                                   services.task_messages),
            capture=logs.capturing_requests,
        )

    @classmethod
    def start(cls, services: Services) -> WorkerRuntime:
        """This process's runtime: its batches, items and model loads counted in Redis with every other
        process's, and a job's log lines shipped to the job's log stream too."""
        figures = Recorder.for_url(services.settings.redis_address).start()
        process_figures.install(figures)
        return cls(services, figures=figures, logs=install_job_log_handler(services.settings), answers=NODE_LOOP)

    def run_batch(
        self, job_id: str, index: int, payload: Any, payload_ref: dict[str, Any] | None = None,
        delivery: Delivery | None = None,
    ) -> None:
        """Run one batch with retries, then record its outcome exactly once.

        `payload_ref` points at the batch's items in storage (a JSON-lines byte range) instead
        of carrying them. `delivery` (this node and the task id) is kept in the node's
        in-flight hash while the batch runs, so the batch can be given back if the node dies.
        A success's record may be answered after this returns (`jobs/nodes/loop_answers.py`); what
        earlier records left pending is used first.
        """
        self.answers.settle()
        self._run(BatchRun(job_id, index, payload, payload_ref, delivery))

    def run_request(self, api_name: str, request_id: str, delivery: Delivery | None = None) -> None:
        """Run one AsyncAPI request and record its outcome once (`jobs/asyncapi/runner.py`); the lines
        logged meanwhile (the predictor's included) go to the request's log stream and its API's too
        (and to those of the requests it batches with)."""
        self.answers.settle()
        with self.logs.capturing_request(api_name, request_id):
            self.requests.run_request(api_name, request_id, delivery)

    def run_queued_requests(self, api_name: str, delivery: Delivery | None = None) -> None:
        """Run a batch of an AsyncAPI's queued requests (`server_side_batching`; `jobs/asyncapi/runner.py`);
        the lines logged meanwhile go to the API's log stream, and those of the batch's `predict` to
        each of its requests' streams too."""
        self.answers.settle()
        with self.logs.capturing_requests(api_name, []):
            self.requests.run_queued(api_name, delivery)

    def finish_job(self, job_id: str, delivery: Delivery | None = None) -> None:
        """The completion task: run `on_job_complete` once, then settle the job's final status
        (`jobs/batch/completion.py`: it rides out Redis errors and duplicate copies of the task)."""
        self.answers.settle()
        with labelled(job_id=job_id), self.logs.capturing_job(job_id):
            self.completion.finish(job_id, delivery)
