"""The job record: its id, its queue, its public spec and the predictor's, and its stored form."""

from __future__ import annotations

import dataclasses

from jobs.batch.job import Job, job_queue_name, new_job_id

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


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
