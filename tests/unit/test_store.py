"""The job store: a job's record, its status and its batches, as workers and the API see them."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from jobs.job import Job, JobStatus, job_queue_name, new_job_id
from jobs.store import Claim, JobStore, Recorded
from foundation.errors import JobNotFound

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
TTL_S = 3600
TERMINAL = [status for status in JobStatus if status.is_terminal]


def make_job(job_id: str = "job-1", **changes: object) -> Job:
    job = Job(
        job_id=job_id,
        api_name="iris",
        workers=2,
        config={"threshold": 0.5},
        timeout=600,
        total_batch_count=4,
        start_time=T0,
        api_spec={"name": "iris"},
        bundle="sha256-abc",
        hardware_queue="cpu",
        tries=2,
    )
    return dataclasses.replace(job, **changes)


@pytest.fixture
def store(redis_client: redis.Redis) -> JobStore:
    return JobStore(redis_client, job_ttl_s=TTL_S)


@pytest.fixture
def running(store: JobStore) -> Job:
    """A submitted job whose batches are all queued."""
    job = make_job()
    store.create(job, JobStatus.RUNNING)
    return job


def job_keys(client: redis.Redis, job_id: str) -> list[str]:
    return sorted(key.decode() for key in client.scan_iter(f"sluice:job:{job_id}*"))


# -- the job record -----------------------------------------------------------------------------
def test_a_created_job_reads_back_as_it_was_submitted(store: JobStore) -> None:
    job = make_job()
    store.create(job)

    assert store.get(job.job_id) == job
    assert store.get(job.job_id, api_name="iris") == job
    state = store.state(job.job_id)
    assert state.job == job
    assert state.status is JobStatus.ENQUEUING
    assert (state.succeeded, state.failed, state.time_total) == (0, 0, 0.0)
    assert state.end_time is None
    assert state.message == ""
    assert state.nodes == []
    assert store.status(job.job_id) is JobStatus.ENQUEUING
    assert store.active_ids() == [job.job_id]


def test_a_job_can_be_created_straight_into_another_status(store: JobStore) -> None:
    store.create(make_job(), JobStatus.RUNNING)

    assert store.state("job-1").status is JobStatus.RUNNING


def test_an_unknown_job_is_not_found(store: JobStore) -> None:
    with pytest.raises(JobNotFound, match="job nope not found"):
        store.get("nope")
    with pytest.raises(JobNotFound, match="job nope not found for api iris"):
        store.state("nope", api_name="iris")
    assert store.status("nope") is None


def test_a_job_is_not_found_under_another_apis_name(store: JobStore, running: Job) -> None:
    with pytest.raises(JobNotFound, match="job job-1 not found for api other"):
        store.get(running.job_id, api_name="other")
    with pytest.raises(JobNotFound, match="job job-1 not found for api other"):
        store.state(running.job_id, api_name="other")


def test_statuses_of_many_jobs_are_read_at_once_and_unknown_ones_are_none(store: JobStore) -> None:
    store.create(make_job("a"), JobStatus.RUNNING)
    store.create(make_job("b"), JobStatus.ENQUEUING)

    assert store.statuses(["a", "b", "gone"]) == {
        "a": JobStatus.RUNNING,
        "b": JobStatus.ENQUEUING,
        "gone": None,
    }


def test_the_nodes_serving_a_job_are_kept_with_it(store: JobStore, running: Job) -> None:
    store.set_nodes(running.job_id, ["celery@a", "celery@b"])

    assert store.state(running.job_id).nodes == ["celery@a", "celery@b"]


def test_an_apis_jobs_are_listed_newest_first(store: JobStore) -> None:
    for job_id, start in [("middle", T0 + 10), ("oldest", T0), ("newest", T0 + 20)]:
        store.create(make_job(job_id, start_time=start))
    store.create(make_job("elsewhere", api_name="other", start_time=T0 + 30))

    assert store.list_ids("iris") == ["newest", "middle", "oldest"]
    assert store.list_ids("iris", limit=2) == ["newest", "middle"]
    assert store.list_ids("other") == ["elsewhere"]
    assert store.list_ids("nobody") == []


# -- status transitions -------------------------------------------------------------------------
def test_a_finished_job_gets_its_end_time_and_leaves_the_active_jobs(store: JobStore, running: Job) -> None:
    assert store.transition(running.job_id, JobStatus.SUCCEEDED, now=T0 + 42)

    state = store.state(running.job_id)
    assert state.status is JobStatus.SUCCEEDED
    assert state.end_time == T0 + 42
    assert store.active_ids() == []


def test_starting_to_run_stamps_no_end_time_and_keeps_the_job_active(store: JobStore) -> None:
    store.create(make_job())

    assert store.transition("job-1", JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING], now=T0 + 1)

    state = store.state("job-1")
    assert state.status is JobStatus.RUNNING
    assert state.end_time is None
    assert store.active_ids() == ["job-1"]


def test_a_job_moves_only_from_the_statuses_it_is_allowed_to_move_from(store: JobStore, running: Job) -> None:
    moved = store.transition(running.job_id, JobStatus.RUNNING, allowed_from=[JobStatus.ENQUEUING])

    assert not moved
    assert store.state(running.job_id).status is JobStatus.RUNNING


def test_a_stopped_job_stays_stopped_when_its_completion_then_reports_success(
    store: JobStore, running: Job
) -> None:
    assert store.transition(running.job_id, JobStatus.STOPPED, message="stopped by request", now=T0 + 5)

    assert not store.transition(running.job_id, JobStatus.SUCCEEDED, now=T0 + 9)

    state = store.state(running.job_id)
    assert state.status is JobStatus.STOPPED
    assert state.message == "stopped by request"
    assert state.end_time == T0 + 5


@pytest.mark.parametrize("first", TERMINAL, ids=lambda s: s.value)
def test_no_terminal_status_is_ever_overwritten(store: JobStore, running: Job, first: JobStatus) -> None:
    store.transition(running.job_id, first, now=T0 + 1)

    for later in JobStatus:
        if later is not first:
            assert not store.transition(running.job_id, later, message="too late", now=T0 + 2)

    state = store.state(running.job_id)
    assert (state.status, state.end_time, state.message) == (first, T0 + 1, "")


def test_an_unknown_job_does_not_move_and_leaves_nothing_behind(
    store: JobStore, redis_client: redis.Redis
) -> None:
    assert not store.transition("ghost", JobStatus.STOPPED, now=T0)

    assert redis_client.keys("*") == []


def test_a_transition_keeps_its_message_for_the_user(store: JobStore, running: Job) -> None:
    store.transition(running.job_id, JobStatus.TIMED_OUT, message="job exceeded its timeout of 600s", now=T0)

    assert store.state(running.job_id).message == "job exceeded its timeout of 600s"


def test_an_active_job_never_expires(store: JobStore, redis_client: redis.Redis, running: Job) -> None:
    store.begin_batch(running.job_id, 0)
    store.record_failure(running.job_id, 0, 1.0, "boom", 2, [1])

    for key in job_keys(redis_client, running.job_id):
        assert redis_client.ttl(key) == -1, key


def test_every_key_of_an_ended_job_expires_after_the_job_ttl(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    store.begin_batch(running.job_id, 0)
    store.record_failure(running.job_id, 0, 1.0, "boom", 2, [1])

    store.transition(running.job_id, JobStatus.COMPLETED_WITH_FAILURES, now=T0)

    keys = job_keys(redis_client, running.job_id)
    assert keys == [f"sluice:job:{running.job_id}{suffix}" for suffix in ("", ":done", ":failed", ":starts")]
    for key in keys:
        assert 0 < redis_client.ttl(key) <= TTL_S, key


def test_a_batch_finishing_after_its_job_was_stopped_leaves_no_key_that_never_expires(
    store: JobStore, redis_client: redis.Redis, running: Job
) -> None:
    store.begin_batch(running.job_id, 0)  # a worker is running batch 0 ...
    store.transition(running.job_id, JobStatus.STOPPED, message="stopped by request", now=T0)
    store.record_success(running.job_id, 0, 3.0)  # ... and reports it after the stop

    for key in job_keys(redis_client, running.job_id):
        assert redis_client.ttl(key) > 0, f"{key} never expires"


# -- batches ------------------------------------------------------------------------------------
def test_each_delivery_of_a_batch_is_counted(store: JobStore, running: Job) -> None:
    starts = [store.begin_batch(running.job_id, 3) for _ in range(3)]

    assert [s.deliveries for s in starts] == [1, 2, 3]
    assert all(s.status is JobStatus.RUNNING and not s.already_recorded for s in starts)
    assert store.begin_batch(running.job_id, 0).deliveries == 1


def test_a_redelivered_batch_learns_it_was_already_recorded(store: JobStore, running: Job) -> None:
    store.begin_batch(running.job_id, 1)
    store.record_success(running.job_id, 1, 0.5)

    again = store.begin_batch(running.job_id, 1)

    assert again.already_recorded
    assert again.deliveries == 2


def test_a_batch_of_a_stopped_job_learns_that_the_job_stopped(store: JobStore, running: Job) -> None:
    store.transition(running.job_id, JobStatus.STOPPED, now=T0)

    assert store.begin_batch(running.job_id, 0).status is JobStatus.STOPPED


def test_a_batch_of_an_unknown_job_learns_there_is_no_job(store: JobStore) -> None:
    start = store.begin_batch("ghost", 0)

    assert start.status is None
    assert not start.already_recorded
    assert start.deliveries == 0


def test_a_batch_is_counted_once_however_often_it_succeeds(store: JobStore, running: Job) -> None:
    assert store.record_success(running.job_id, 0, 2.0)
    assert not store.record_success(running.job_id, 0, 7.0)
    assert not store.record_success(running.job_id, 0, 7.0)

    state = store.state(running.job_id)
    assert (state.succeeded, state.failed) == (1, 0)
    assert state.time_total == 2.0


def test_a_batch_that_succeeded_is_not_counted_again_when_another_delivery_fails(
    store: JobStore, running: Job
) -> None:
    assert store.record_success(running.job_id, 0, 2.0)
    assert not store.record_failure(running.job_id, 0, 5.0, "ValueError: late", 2, [1, 2])

    state = store.state(running.job_id)
    assert (state.succeeded, state.failed, state.time_total) == (1, 0, 2.0)
    assert store.failed_batches(running.job_id) == []


def test_a_batch_is_counted_once_however_often_it_fails(store: JobStore, running: Job) -> None:
    assert store.record_failure(running.job_id, 2, 1.0, "first error", 2, ["a"])
    assert not store.record_failure(running.job_id, 2, 1.0, "second error", 2, ["a"])
    assert not store.record_success(running.job_id, 2, 1.0)

    state = store.state(running.job_id)
    assert (state.succeeded, state.failed) == (0, 1)
    assert [f["error"] for f in store.failed_batches(running.job_id)] == ["first error"]


def test_failed_batches_are_kept_with_error_tries_and_payload_in_batch_order(
    store: JobStore, running: Job
) -> None:
    store.record_failure(running.job_id, 10, 1.0, "Traceback ...\nKeyError: 'x'", 3, [{"x": 1}])
    store.record_failure(running.job_id, 2, 1.0, "ValueError: bad row", 3, [[5.1, 3.5]])
    store.record_success(running.job_id, 5, 1.0)

    assert store.failed_batches(running.job_id) == [
        {"index": 2, "error": "ValueError: bad row", "tries": 3, "payload": [[5.1, 3.5]]},
        {"index": 10, "error": "Traceback ...\nKeyError: 'x'", "tries": 3, "payload": [{"x": 1}]},
    ]


def test_batches_left_and_average_time_follow_the_recorded_outcomes(store: JobStore, running: Job) -> None:
    assert store.state(running.job_id).average_time_per_batch is None

    store.record_success(running.job_id, 0, 1.0)
    store.record_success(running.job_id, 1, 2.5)
    store.record_failure(running.job_id, 2, 0.5, "boom", 2, [])

    state = store.state(running.job_id)
    assert state.batches_in_queue == 1
    assert state.average_time_per_batch == pytest.approx(4.0 / 3)


def test_an_ended_job_has_no_batches_in_queue(store: JobStore, running: Job) -> None:
    store.record_success(running.job_id, 0, 1.0)
    store.transition(running.job_id, JobStatus.STOPPED, now=T0)

    assert store.state(running.job_id).batches_in_queue == 0


def test_only_the_first_caller_may_run_a_jobs_completion(store: JobStore, running: Job) -> None:
    assert store.claim_completion(running.job_id, "task-1/a", "task-1") is Claim.CLAIMED
    assert store.claim_completion(running.job_id, "task-2/b", "task-2") is Claim.BUSY
    assert store.claim_completion(running.job_id, "task-3/c", "task-3") is Claim.BUSY


def test_a_repeat_of_the_claiming_call_is_still_the_claimant(store: JobStore, running: Job) -> None:
    assert store.claim_completion(running.job_id, "task-1/a", "task-1") is Claim.CLAIMED

    assert store.claim_completion(running.job_id, "task-1/a", "task-1") is Claim.CLAIMED


def test_a_redelivery_of_a_claimant_that_died_before_its_hook_was_done_learns_it_died(
    store: JobStore, running: Job
) -> None:
    assert store.claim_completion(running.job_id, "task-1/first-life", "task-1") is Claim.CLAIMED

    assert store.claim_completion(running.job_id, "task-1/second-life", "task-1") is Claim.DIED


def test_once_the_hook_ran_every_later_claimant_only_settles_the_job(store: JobStore, running: Job) -> None:
    store.claim_completion(running.job_id, "task-1/a", "task-1")
    store.mark_hook_done(running.job_id, "on_job_complete raised: ValueError: no")

    assert store.claim_completion(running.job_id, "task-1/b", "task-1") is Claim.RAN
    assert store.claim_completion(running.job_id, "task-2/c", "task-2") is Claim.RAN
    assert store.state(running.job_id).hook_message == "on_job_complete raised: ValueError: no"


def test_the_completion_of_a_job_whose_record_is_gone_is_told_so(store: JobStore) -> None:
    assert store.claim_completion("gone", "task-1/a", "task-1") is Claim.GONE


# -- repeats of a call whose reply was lost ---------------------------------------------------------
@pytest.fixture
def one_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every call gets the same token: each call looks like a repeat of the one before (its reply lost)."""
    monkeypatch.setattr("jobs.store.new_token", lambda: "the-same-call")


def test_a_repeat_of_the_recording_that_completed_the_job_is_told_so_again(
    store: JobStore, running: Job, one_token: None
) -> None:
    store.seal(running.job_id, 1)

    assert store.record_success(running.job_id, 0, 0.1) is Recorded.COMPLETED_JOB
    assert store.record_success(running.job_id, 0, 0.1) is Recorded.COMPLETED_JOB
    assert store.state(running.job_id).succeeded == 1


def test_a_repeat_of_a_seal_that_completed_the_job_is_told_so_again(store: JobStore, running: Job) -> None:
    store.record_success(running.job_id, 0, 0.1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("jobs.store.new_token", lambda: "the-same-call")
        assert store.seal(running.job_id, 1) is True
        assert store.seal(running.job_id, 1) is True

    assert store.seal(running.job_id, 1) is False  # a call of its own


def test_a_repeat_of_a_transition_that_moved_the_job_is_told_it_moved(
    store: JobStore, running: Job, one_token: None
) -> None:
    assert store.transition(running.job_id, JobStatus.STOPPED) is True

    assert store.transition(running.job_id, JobStatus.STOPPED) is True
    assert store.state(running.job_id).status is JobStatus.STOPPED


def test_another_transition_to_the_status_the_job_already_has_did_not_move_it(store: JobStore, running: Job) -> None:
    assert store.transition(running.job_id, JobStatus.STOPPED) is True

    assert store.transition(running.job_id, JobStatus.STOPPED) is False


def test_a_repeat_of_a_batchs_start_counts_one_delivery(store: JobStore, running: Job, one_token: None) -> None:
    assert store.begin_batch(running.job_id, 0).deliveries == 1
    assert store.begin_batch(running.job_id, 0).deliveries == 1


def test_every_delivery_of_a_batch_is_counted(store: JobStore, running: Job) -> None:
    assert [store.begin_batch(running.job_id, 0).deliveries for _ in range(3)] == [1, 2, 3]


def test_the_time_every_batch_was_recorded_is_kept_for_beat(store: JobStore, running: Job) -> None:
    store.record_success(running.job_id, 0, 0.1)
    assert store.state(running.job_id).finishing_at is None

    store.seal(running.job_id, 1, now=T0 + 7)

    state = store.state(running.job_id)
    assert state.finishing_at == T0 + 7 and state.all_recorded


def test_which_batches_are_recorded_is_read_at_once(store: JobStore, running: Job) -> None:
    store.record_success(running.job_id, 1, 0.1)
    store.record_failure(running.job_id, 3, 0.1, "boom", 1, [])

    assert store.recorded(running.job_id, [0, 1, 2, 3]) == {0: False, 1: True, 2: False, 3: True}
    assert store.recorded(running.job_id, []) == {}


# -- the job itself -----------------------------------------------------------------------------
def test_job_ids_made_later_sort_later() -> None:
    times = [T0, T0 + 0.001, T0 + 0.5, T0 + 60, T0 + 86_400 * 365]

    ids = [new_job_id(now) for now in times]

    assert sorted(ids) == ids


def test_job_ids_made_at_the_same_moment_are_unique() -> None:
    ids = {new_job_id(T0) for _ in range(200)}

    assert len(ids) == 200
    assert all(len(job_id) == 20 and int(job_id, 16) >= 0 for job_id in ids)


def test_a_job_id_made_without_a_time_uses_the_clock() -> None:
    assert new_job_id(T0) < new_job_id() < new_job_id(T0 + 86_400 * 365 * 100)


def test_each_job_has_a_queue_of_its_own() -> None:
    assert make_job("abc").queue == job_queue_name("abc") == "job.abc"


def test_the_public_spec_carries_what_the_user_submitted_with_an_rfc3339_start_time() -> None:
    job = make_job()

    assert job.spec() == {
        "job_id": "job-1",
        "api_name": "iris",
        "kind": "BatchAPI",
        "workers": 2,
        "config": {"threshold": 0.5},
        "timeout": 600,
        "total_batch_count": 4,
        "start_time": "2023-11-14T22:13:20Z",
    }
    assert "bundle" not in job.spec() and "api_spec" not in job.spec()


def test_the_predictor_sees_the_spec_without_kind_or_timeout() -> None:
    spec = make_job().predictor_job_spec()

    assert "kind" not in spec and "timeout" not in spec
    assert spec["job_id"] == "job-1"
    assert spec["start_time"] == "2023-11-14T22:13:20Z"


def test_a_job_survives_the_round_trip_through_its_stored_form() -> None:
    job = make_job(retry_of="job-0", timeout=None)

    assert Job.from_dict(job.to_dict()) == job


# -- completion (fan-in) --------------------------------------------------------------------------
def test_the_last_batch_of_a_sealed_job_is_told_it_completed_the_job_once(store: JobStore, running: Job) -> None:
    assert store.record_success(running.job_id, 0, 0.1) is Recorded.COUNTED
    assert store.seal(running.job_id, 3) is False
    assert store.record_failure(running.job_id, 1, 0.1, "boom", 1, [1]) is Recorded.COUNTED

    assert store.record_success(running.job_id, 2, 0.1) is Recorded.COMPLETED_JOB
    assert store.record_success(running.job_id, 2, 0.1) is Recorded.DUPLICATE
    assert store.seal(running.job_id, 3) is False  # told once, whoever asks again


def test_a_job_whose_batches_all_finished_before_the_seal_is_completed_by_the_seal(
    store: JobStore, running: Job
) -> None:
    for index in range(3):
        assert store.record_success(running.job_id, index, 0.1) is Recorded.COUNTED  # not sealed yet

    assert store.seal(running.job_id, 3) is True
    assert store.seal(running.job_id, 3) is False
