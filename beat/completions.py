"""Beat's net under job completion: a job whose batches are all recorded gets its completion task.

The completion task is sent by whoever records a job's last batch, once. If that caller never
hears Redis's answer (a stall outlasting its retries: Redis ran the script and answered nobody),
or dies before sending, the job would stay `status_running` for good. So beat sends the
completion again for any running job whose batches were all recorded at least `grace_s` ago and
which has not ended, unless a completion is running it now (claimed, its hook not yet done: a
dead claimant's delivery is given back by its node, see `jobs/transport/settle.py`). Copies are harmless:
the job store's claim lets one run `on_job_complete` (`jobs/batch/completion.py`).
"""

from __future__ import annotations

import logging

from foundation.settings import Settings
from jobs.batch.job import JobStatus
from jobs.batch.publish import SendCompletion
from jobs.store import CompletionClaims, JobRecords, JobState

from .steps import judge_each

log = logging.getLogger(__name__)

# Shortest wait, after a job's last batch is recorded, before beat sends its completion again.
COMPLETION_GRACE_S = 5.0


def completion_grace_s(settings: Settings) -> float:
    """Two beat intervals at least: a completion sent in time is normally running by then."""
    return max(COMPLETION_GRACE_S, 2 * settings.beat_interval_s)


def resend_completions(
    records: JobRecords, claims: CompletionClaims, send_completion: SendCompletion, now: float,
    grace_s: float = COMPLETION_GRACE_S,
) -> list[str]:
    """Send the completion task again for every job left unended `grace_s` after its last batch; returns their ids."""

    def judge(state: JobState) -> bool:
        if state.status is not JobStatus.RUNNING or state.finishing_at is None:
            return False
        if state.completion_claimed and state.hook_message is None:
            return False  # a completion is running on_job_complete now
        last = max(state.finishing_at, state.completion_resent_at or state.finishing_at)
        if now - last < grace_s:
            return False
        job = state.job
        claims.mark_completion_resent(job.job_id, now)
        send_completion(job.job_id, job.queue)
        log.warning("job %s: every batch was recorded %.0fs ago but it has not ended; its completion is sent again",
                    job.job_id, now - state.finishing_at)
        return True

    return judge_each(records, "resend_completions", judge)
