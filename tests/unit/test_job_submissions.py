"""One builder of job submissions for the client and the CLI (`foundation/job_submissions.py`), and
what it builds is what the server reads."""

from __future__ import annotations

from foundation.job_submissions import submission_body, task_submission_body
from jobs.batch.submission import parse_job_request


def test_an_item_list_with_every_option_is_read_back_as_given() -> None:
    body = submission_body(items=[1, 2, 3], batch_size=2, workers=3, config={"k": 1}, timeout=60, tries=4)
    request = parse_job_request(body)
    assert (request.workers, request.config, request.timeout) == (3, {"k": 1}, 60)
    assert body["sqs_dead_letter_queue"]["max_receive_count"] == 4
    assert body["item_list"] == {"items": [1, 2, 3], "batch_size": 2}


def test_options_go_over_a_whole_submission_and_workers_default_to_one() -> None:
    from_file = {"file_path_lister": {"s3_paths": ["s3://b/x"], "batch_size": 1}, "workers": 5, "config": {"a": 1}}
    assert submission_body(from_file)["workers"] == 5
    assert submission_body(from_file, workers=2, config={"b": 2}) == {**from_file, "workers": 2, "config": {"b": 2}}
    assert submission_body({"item_list": {"items": [1], "batch_size": 1}})["workers"] == 1
    assert from_file["workers"] == 5  # the caller's body is left as it was


def test_a_task_submission_carries_only_what_is_given() -> None:
    assert task_submission_body() == {}
    assert task_submission_body({"epochs": 2}, 600) == {"config": {"epochs": 2}, "timeout": 600}
