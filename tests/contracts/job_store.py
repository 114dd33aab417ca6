"""The job store's contract (`jobs.store.JobStorage`: job records, the batch ledger, completion claims).

Fixtures a subclass provides: `store` (empty). Run against the in-memory store in
tests/unit/test_store_contract.py, and against Redis's and the in-memory one (a parametrised
fixture) in tests/integration/test_store_redis.py; what only Redis has (expiry, keys left behind,
the nodes' in-flight hashes it shares with the node registry) is tested beside the latter.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from foundation.errors import JobNotFound
from jobs.batch.job import Job, JobStatus
from jobs.store import Claim, JobStorage, Recorded

T0 = 1_700_000_000.0
TERMINAL = [status for status in JobStatus if status.is_terminal]


def make_job(job_id: str = "job-1", **changes: object) -> Job:
    job = Job(
        job_id=job_id, api_name="iris", workers=2, config={"threshold": 0.5}, timeout=600, total_batch_count=4,
        start_time=T0, api_spec={"name": "iris"}, bundle="sha256-abc", hardware_queue="cpu", tries=2,
    )
    return dataclasses.replace(job, **changes)


class JobStoreContract:
    @pytest.fixture
    def running(self, store: JobStorage) -> Job:
        """A submitted job whose batches are all queued."""
        job = make_job()
        store.create(job, JobStatus.RUNNING)
        return job

    @pytest.fixture
    def one_token(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every call gets the same token: each call looks like a repeat of the one before (its reply lost)."""
        monkeypatch.setattr("jobs.store.values.new_token", lambda: "the-same-call")

    # -- records --------------------------------------------------------------------------------
    def test_a_created_job_reads_back_as_it_was_submitted(self, store: JobStorage) -> None:
        job = make_job(retry_of="job-0", output={"uri": "s3://out"})
        store.create(job)

        assert store.get(job.job_id) == job
        assert store.get(job.job_id, api_name="iris") == job
        state = store.state(job.job_id, api_name="iris")
        assert (state.job, state.status, state.succeeded, state.failed, state.time_total) == (
            job, JobStatus.ENQUEUING, 0, 0, 0.0)
        assert (state.end_time, state.message, state.nodes, state.sealed_total) == (None, "", [], None)
        assert store.status(job.job_id) is JobStatus.ENQUEUING
        assert store.active_ids() == [job.job_id]
        assert store.enqueue_seen(job.job_id) == T0

    def test_a_job_can_be_created_straight_into_another_status(self, store: JobStorage) -> None:
        store.create(make_job(), JobStatus.RUNNING)

        assert store.state("job-1").status is JobStatus.RUNNING

    def test_an_unknown_job_or_one_under_another_api_is_not_found(self, store: JobStorage, running: Job) -> None:
        with pytest.raises(JobNotFound, match="job nope not found"):
            store.get("nope")
        with pytest.raises(JobNotFound, match="job nope not found for api iris"):
            store.state("nope", api_name="iris")
        with pytest.raises(JobNotFound, match="job job-1 not found for api other"):
            store.get(running.job_id, api_name="other")
        with pytest.raises(JobNotFound, match="job job-1 not found for api other"):
            store.state(running.job_id, api_name="other")
        assert store.status("nope") is None
        assert store.enqueue_seen("nope") is None
        assert store.statuses(["job-1", "nope"]) == {"job-1": JobStatus.RUNNING, "nope": None}

    def test_statuses_of_many_jobs_are_read_at_once_and_unknown_ones_are_none(self, store: JobStorage) -> None:
        store.create(make_job("a"), JobStatus.RUNNING)
        store.create(make_job("b"), JobStatus.ENQUEUING)

        assert store.statuses(["a", "b", "gone"]) == {"a": JobStatus.RUNNING, "b": JobStatus.ENQUEUING, "gone": None}

    def test_an_apis_jobs_are_listed_newest_first(self, store: JobStorage) -> None:
        for job_id, start in [("middle", T0 + 10), ("oldest", T0), ("newest", T0 + 20)]:
            store.create(make_job(job_id, start_time=start))
        store.create(make_job("elsewhere", api_name="other", start_time=T0 + 30))

        assert store.list_ids("iris") == ["newest", "middle", "oldest"]
        assert store.list_ids("iris", limit=2) == ["newest", "middle"]
        assert store.list_ids("other") == ["elsewhere"]
        assert store.list_ids("nobody") == []

    def test_a_rewritten_record_nodes_and_enqueuer_liveness_are_kept(self, store: JobStorage, running: Job) -> None:
        store.update_record(dataclasses.replace(running, total_batch_count=9))
        store.set_nodes(running.job_id, ["celery@a", "celery@b"])
        store.touch_enqueue(running.job_id, T0 + 3)

        state = store.state(running.job_id)
        assert (state.job.total_batch_count, state.nodes) == (9, ["celery@a", "celery@b"])
        assert store.enqueue_seen(running.job_id) == T0 + 3

    def test_a_nodes_note_on_the_predictor_is_kept_and_an_unknown_job_gets_none(
            self, store: JobStorage, running: Job) -> None:
        assert store.state(running.job_id).predictor_note == ""
        store.note_predictor(running.job_id, "building the predictor on celery@a")
        assert store.state(running.job_id).predictor_note == "building the predictor on celery@a"

        store.note_predictor("gone", "building the predictor on celery@a")
        assert store.status("gone") is None
        with pytest.raises(JobNotFound):
            store.state("gone")

    # -- statuses -------------------------------------------------------------------------------
    def test_a_finished_job_gets_its_end_time_and_leaves_the_active_jobs(self, store: JobStorage, running: Job) -> None:
        assert store.transition(running.job_id, JobStatus.SUCCEEDED, now=T0 + 42)

        state = store.state(running.job_id)
        assert (state.status, state.end_time) == (JobStatus.SUCCEEDED, T0 + 42)
        assert store.active_ids() == []

    def test_starting_to_run_stamps_no_end_time_and_keeps_the_job_active(self, store: JobStorage) -> None:
        store.create(make_job())

        assert store.transition("job-1", JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING], now=T0 + 1)

        state = store.state("job-1")
        assert (state.status, state.end_time) == (JobStatus.RUNNING, None)
        assert store.active_ids() == ["job-1"]

    def test_a_job_moves_only_from_the_statuses_it_is_allowed_to_move_from(
        self, store: JobStorage, running: Job
    ) -> None:
        assert not store.transition(running.job_id, JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING])
        assert store.state(running.job_id).status is JobStatus.RUNNING
        assert not store.transition("ghost", JobStatus.STOPPED, now=T0)

    def test_a_stopped_job_stays_stopped_when_its_completion_then_reports_success(
        self, store: JobStorage, running: Job
    ) -> None:
        assert store.transition(running.job_id, JobStatus.STOPPED, message="stopped by request", now=T0 + 5)

        assert not store.transition(running.job_id, JobStatus.SUCCEEDED, now=T0 + 9)

        state = store.state(running.job_id)
        assert (state.status, state.message, state.end_time) == (JobStatus.STOPPED, "stopped by request", T0 + 5)

    @pytest.mark.parametrize("first", TERMINAL, ids=lambda s: s.value)
    def test_no_terminal_status_is_ever_overwritten(self, store: JobStorage, running: Job, first: JobStatus) -> None:
        store.transition(running.job_id, first, message="first", now=T0 + 1)

        for later in JobStatus:
            if later is not first:
                assert not store.transition(running.job_id, later, message="too late", now=T0 + 2)

        state = store.state(running.job_id)
        assert (state.status, state.end_time, state.message) == (first, T0 + 1, "first")

    def test_a_transition_keeps_its_message_for_the_user(self, store: JobStorage, running: Job) -> None:
        store.transition(running.job_id, JobStatus.TIMED_OUT, message="job exceeded its timeout of 600s", now=T0)

        assert store.state(running.job_id).message == "job exceeded its timeout of 600s"

    def test_a_repeat_of_a_transition_that_moved_the_job_is_told_it_moved(
        self, store: JobStorage, running: Job, one_token: None
    ) -> None:
        assert store.transition(running.job_id, JobStatus.STOPPED) is True
        assert store.transition(running.job_id, JobStatus.STOPPED) is True
        assert store.state(running.job_id).status is JobStatus.STOPPED

    def test_another_transition_to_the_status_the_job_already_has_did_not_move_it(
        self, store: JobStorage, running: Job
    ) -> None:
        assert store.transition(running.job_id, JobStatus.STOPPED) is True
        assert store.transition(running.job_id, JobStatus.STOPPED) is False

    # -- batches --------------------------------------------------------------------------------
    def test_each_delivery_of_a_batch_is_counted_and_a_repeat_of_one_start_is_not(
        self, store: JobStorage, running: Job
    ) -> None:
        starts = [store.begin_batch(running.job_id, 3) for _ in range(3)]
        assert [s.deliveries for s in starts] == [1, 2, 3]
        assert all(s.status is JobStatus.RUNNING and not s.already_recorded for s in starts)
        assert store.begin_batch(running.job_id, 0).deliveries == 1
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("jobs.store.values.new_token", lambda: "the-same-call")
            assert [store.begin_batch(running.job_id, 1).deliveries for _ in range(2)] == [1, 1]

    def test_a_batch_learns_whether_it_was_recorded_and_whether_its_job_still_runs(
        self, store: JobStorage, running: Job
    ) -> None:
        store.begin_batch(running.job_id, 1)
        store.record_success(running.job_id, 1, 0.5)
        again = store.begin_batch(running.job_id, 1)
        assert again.already_recorded and again.deliveries == 2

        store.transition(running.job_id, JobStatus.STOPPED, now=T0)
        stopped = store.begin_batch(running.job_id, 0)
        assert (stopped.status, stopped.deliveries) == (JobStatus.STOPPED, 0)

        ghost = store.begin_batch("ghost", 0)
        assert (ghost.status, ghost.already_recorded, ghost.deliveries) == (None, False, 0)

    def test_a_batch_is_counted_once_whichever_outcome_comes_first(self, store: JobStorage, running: Job) -> None:
        assert store.record_success(running.job_id, 0, 2.0) is Recorded.COUNTED
        assert store.record_success(running.job_id, 0, 7.0) is Recorded.DUPLICATE
        assert store.record_failure(running.job_id, 0, 5.0, "late", 2, [1]) is Recorded.DUPLICATE
        assert store.record_failure(running.job_id, 2, 1.0, "first error", 2, ["a"]) is Recorded.COUNTED
        assert store.record_failure(running.job_id, 2, 1.0, "second error", 2, ["a"]) is Recorded.DUPLICATE
        assert not store.record_success(running.job_id, 2, 1.0)

        state = store.state(running.job_id)
        assert (state.succeeded, state.failed, state.time_total) == (1, 1, 3.0)
        assert [f["error"] for f in store.failed_batches(running.job_id)] == ["first error"]
        assert store.recorded(running.job_id, [0, 1, 2]) == {0: True, 1: False, 2: True}
        assert store.recorded(running.job_id, []) == {}
        assert store.recorded_indexes(running.job_id) == {0, 2}

    def test_failed_batches_are_kept_with_error_tries_and_payload_in_batch_order(
        self, store: JobStorage, running: Job
    ) -> None:
        store.record_failure(running.job_id, 10, 1.0, "Traceback ...\nKeyError: 'x'", 3, [{"x": 1}])
        store.record_failure(running.job_id, 2, 1.0, "ValueError", 3, None, {"uri": "s3://in/a.jsonl", "first_line": 1})
        store.record_success(running.job_id, 5, 1.0)

        assert store.failed_batches(running.job_id) == [
            {"index": 2, "error": "ValueError", "tries": 3, "payload": None,
             "payload_ref": {"uri": "s3://in/a.jsonl", "first_line": 1}},
            {"index": 10, "error": "Traceback ...\nKeyError: 'x'", "tries": 3, "payload": [{"x": 1}]},
        ]

    def test_batches_left_and_average_time_follow_the_recorded_outcomes(self, store: JobStorage, running: Job) -> None:
        assert store.state(running.job_id).average_time_per_batch is None

        store.record_success(running.job_id, 0, 1.0)
        store.record_success(running.job_id, 1, 2.5)
        store.record_failure(running.job_id, 2, 0.5, "boom", 2, [])

        state = store.state(running.job_id)
        assert state.batches_in_queue == 1
        assert state.average_time_per_batch == pytest.approx(4.0 / 3)
        store.transition(running.job_id, JobStatus.STOPPED, now=T0)
        assert store.state(running.job_id).batches_in_queue == 0  # an ended job has none left

    def test_kept_payloads_are_dropped_once_their_batch_is_recorded(self, store: JobStorage, running: Job) -> None:
        store.keep_payloads(running.job_id, {0: ([1, 2], None), 1: (None, {"uri": "/in/a", "first_line": 3})})

        assert store.kept_payloads(running.job_id, [0, 1, 5]) == {
            0: ([1, 2], None), 1: (None, {"uri": "/in/a", "first_line": 3})}
        store.record_success(running.job_id, 0, 0.1)
        assert store.kept_payloads(running.job_id, [0, 1]) == {1: (None, {"uri": "/in/a", "first_line": 3})}
        assert store.kept_payloads(running.job_id, []) == {}

    def test_the_output_parts_of_a_job_are_remembered(self, store: JobStorage, running: Job) -> None:
        store.record_part(running.job_id, 3, 10)
        store.record_part(running.job_id, 0, 7)

        assert store.parts(running.job_id) == {0: 7, 3: 10}

    def test_tries_used_up_by_the_time_limit_are_kept_per_batch(self, store: JobStorage, running: Job) -> None:
        assert store.timed_out_tries(running.job_id, 0) == 0

        store.mark_timed_out(running.job_id, 0, 1)
        store.mark_timed_out(running.job_id, 0, 2)
        store.mark_timed_out(running.job_id, 4, 1)

        assert [store.timed_out_tries(running.job_id, index) for index in (0, 1, 4)] == [2, 0, 1]

    def test_a_batchs_begin_says_the_tries_the_time_limit_used_up(self, store: JobStorage, running: Job) -> None:
        store.mark_timed_out(running.job_id, 4, 2)

        assert store.begin_batch(running.job_id, 4).timed_out_tries == 2
        assert store.begin_batch(running.job_id, 1).timed_out_tries == 0

    # -- completion (fan-in) --------------------------------------------------------------------
    def test_the_last_batch_of_a_sealed_job_is_told_it_completed_the_job_once(
        self, store: JobStorage, running: Job
    ) -> None:
        assert store.record_success(running.job_id, 0, 0.1) is Recorded.COUNTED
        assert store.seal(running.job_id, 3, now=T0 + 1) is False
        assert store.state(running.job_id).sealed_total == 3
        assert store.record_failure(running.job_id, 1, 0.1, "boom", 1, [1]) is Recorded.COUNTED

        assert store.record_success(running.job_id, 2, 0.1) is Recorded.COMPLETED_JOB
        assert store.record_success(running.job_id, 2, 0.1) is Recorded.DUPLICATE
        assert store.seal(running.job_id, 3) is False  # told once, whoever asks again
        assert store.state(running.job_id).all_recorded

    def test_a_begin_sent_ahead_answers_what_a_begin_waited_for_answers(self, store: JobStorage, running: Job) -> None:
        sent = [store.send_begin_batch(running.job_id, 4) for _ in range(2)]
        starts = [answer.answer() for answer in sent]  # both sent before either answer is read
        assert [s.deliveries for s in starts] == [1, 2]
        assert all(s.status is JobStatus.RUNNING and not s.already_recorded for s in starts)

        store.record_success(running.job_id, 4, 0.1)
        assert store.send_begin_batch(running.job_id, 4).answer().already_recorded
        store.transition(running.job_id, JobStatus.STOPPED, now=T0)
        assert store.send_begin_batch(running.job_id, 5).answer().status is JobStatus.STOPPED

    def test_a_record_sent_ahead_counts_once_and_its_answer_tells_who_completed_the_job(
        self, store: JobStorage, running: Job
    ) -> None:
        first = store.send_record_success(running.job_id, 0, 0.5)
        again = store.send_record_success(running.job_id, 0, 9.0)  # sent before the first answer is read
        assert (first.answer(), again.answer()) == (Recorded.COUNTED, Recorded.DUPLICATE)
        store.seal(running.job_id, 2)
        last = store.send_record_success(running.job_id, 1, 0.5)
        assert last.answer() is Recorded.COMPLETED_JOB
        state = store.state(running.job_id)
        assert (state.succeeded, state.time_total, state.all_recorded) == (2, 1.0, True)

    def test_a_job_whose_batches_all_finished_before_the_seal_is_completed_by_the_seal(
        self, store: JobStorage, running: Job
    ) -> None:
        for index in range(3):
            assert store.record_success(running.job_id, index, 0.1) is Recorded.COUNTED  # not sealed yet
        assert store.state(running.job_id).finishing_at is None

        assert store.seal(running.job_id, 3, now=T0 + 7) is True
        assert store.seal(running.job_id, 3) is False
        state = store.state(running.job_id)
        assert state.finishing_at == T0 + 7 and state.all_recorded

    def test_a_repeat_of_the_recording_that_completed_the_job_is_told_so_again(
        self, store: JobStorage, running: Job, one_token: None
    ) -> None:
        store.seal(running.job_id, 1)

        assert store.record_success(running.job_id, 0, 0.1) is Recorded.COMPLETED_JOB
        assert store.record_success(running.job_id, 0, 0.1) is Recorded.COMPLETED_JOB
        assert store.state(running.job_id).succeeded == 1

    def test_a_repeat_of_a_seal_that_completed_the_job_is_told_so_again(self, store: JobStorage, running: Job) -> None:
        store.record_success(running.job_id, 0, 0.1)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("jobs.store.values.new_token", lambda: "the-same-call")
            assert store.seal(running.job_id, 1) is True
            assert store.seal(running.job_id, 1) is True

        assert store.seal(running.job_id, 1) is False  # a call of its own

    def test_many_threads_recording_the_same_batches_complete_the_job_exactly_once(
        self, store: JobStorage, running: Job
    ) -> None:
        store.seal(running.job_id, 20)
        told: list[Recorded] = []
        lock = threading.Lock()

        def record_all() -> None:
            for index in range(20):
                outcome = store.record_success(running.job_id, index, 0.01)
                with lock:
                    told.append(outcome)

        threads = [threading.Thread(target=record_all) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert told.count(Recorded.COMPLETED_JOB) == 1
        assert told.count(Recorded.COUNTED) == 19
        assert store.state(running.job_id).succeeded == 20

    # -- completion claims ----------------------------------------------------------------------
    def test_only_the_first_claimant_runs_a_jobs_completion_and_its_own_repeat_still_may(
        self, store: JobStorage, running: Job
    ) -> None:
        assert store.claim_completion(running.job_id, "task-1/a", "task-1") is Claim.CLAIMED
        assert store.claim_completion(running.job_id, "task-1/a", "task-1") is Claim.CLAIMED
        assert store.claim_completion(running.job_id, "task-2/b", "task-2") is Claim.BUSY
        assert store.claim_completion(running.job_id, "task-3/c", "task-3") is Claim.BUSY
        assert store.claim_completion(running.job_id, "task-1/second-life", "task-1") is Claim.DIED
        assert store.state(running.job_id).completion_claimed

    def test_once_the_hook_ran_every_later_claimant_only_settles_the_job(self, store: JobStorage, running: Job) -> None:
        store.claim_completion(running.job_id, "task-1/a", "task-1")
        store.mark_hook_done(running.job_id, "on_job_complete raised: ValueError: no")
        store.mark_completion_resent(running.job_id, T0 + 9)

        assert store.claim_completion(running.job_id, "task-1/b", "task-1") is Claim.RAN
        assert store.claim_completion(running.job_id, "task-2/c", "task-2") is Claim.RAN
        state = store.state(running.job_id)
        assert (state.hook_message, state.completion_resent_at) == ("on_job_complete raised: ValueError: no", T0 + 9)

    def test_the_completion_of_a_job_whose_record_is_gone_is_told_so(self, store: JobStorage) -> None:
        assert store.claim_completion("gone", "task-1/a", "task-1") is Claim.GONE
