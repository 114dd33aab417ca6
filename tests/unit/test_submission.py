"""Job submission bodies: what a user may send, and errors that name the field to fix."""

from __future__ import annotations

from typing import Any

import pytest

from foundation.errors import BadRequest
from jobs.batch.submission import parse_job_request, split_items

ITEMS = {"items": [[5.1, 3.5], [4.9, 3.0], [6.2, 3.4]], "batch_size": 2}
FILES = {"s3_paths": ["s3://bucket/input/"], "batch_size": 10}


def error_of(body: Any) -> str:
    with pytest.raises(BadRequest) as info:
        parse_job_request(body)
    assert info.value.http_status == 400
    return info.value.message


def test_an_item_list_job_gets_cortexs_defaults() -> None:
    request = parse_job_request({"item_list": ITEMS})

    assert request.item_list is not None
    assert request.item_list.items == ITEMS["items"]
    assert request.item_list.batch_size == 2
    assert request.workers == 1
    assert request.config == {}
    assert request.timeout is None
    assert request.tries == 1


def test_workers_config_and_timeout_are_read() -> None:
    request = parse_job_request(
        {"item_list": ITEMS, "workers": 4, "config": {"dest": "s3://out/", "nested": {"k": 1}}, "timeout": 300}
    )

    assert (request.workers, request.timeout) == (4, 300)
    assert request.config == {"dest": "s3://out/", "nested": {"k": 1}}


def test_tries_come_from_the_dead_letter_queues_max_receive_count() -> None:
    request = parse_job_request(
        {"item_list": ITEMS, "sqs_dead_letter_queue": {"arn": "arn:aws:sqs:us-west-2:1:dlq", "max_receive_count": 3}}
    )

    assert request.tries == 3


def test_a_dead_letter_queue_without_an_arn_still_sets_tries() -> None:
    assert parse_job_request({"item_list": ITEMS, "sqs_dead_letter_queue": {"max_receive_count": 2}}).tries == 2


def test_a_job_without_a_source_is_refused_naming_the_sources() -> None:
    assert error_of({"workers": 1}) == (
        "exactly one of item_list, file_path_lister, delimited_files, retry_failed_of is required; got none"
    )


def test_a_job_with_two_sources_is_refused_naming_both() -> None:
    assert error_of({"item_list": ITEMS, "delimited_files": FILES}) == (
        "exactly one of item_list, file_path_lister, delimited_files, retry_failed_of is required; "
        "got item_list and delimited_files"
    )


def test_a_null_source_counts_as_absent() -> None:
    request = parse_job_request({"item_list": ITEMS, "file_path_lister": None, "delimited_files": None})

    assert request.item_list is not None


@pytest.mark.parametrize("source", ["file_path_lister", "delimited_files"])
def test_file_sources_are_accepted_and_named_as_the_source(source: str) -> None:
    request = parse_job_request({source: FILES})

    assert request.source == source
    assert getattr(request, source).s3_paths == FILES["s3_paths"]


def test_an_output_defaults_to_json_lines_and_refuses_unknown_formats() -> None:
    request = parse_job_request({"item_list": ITEMS, "output": {"path": "s3://bucket/out"}})

    assert request.output is not None and request.output.format == "jsonl"
    assert "output.format" in error_of({"item_list": ITEMS, "output": {"path": "s3://b/o", "format": "xml"}})


def test_a_retry_of_failed_batches_is_a_source_of_its_own() -> None:
    assert parse_job_request({"retry_failed_of": "abc"}).source == "retry_failed_of"
    assert "got item_list and retry_failed_of" in error_of({"item_list": ITEMS, "retry_failed_of": "abc"})


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"item_list": {"items": [1]}}, "item_list.batch_size: field required"),
        ({"item_list": {"items": [1], "batch_size": 0}}, "item_list.batch_size: "),
        ({"item_list": {"items": [], "batch_size": 1}}, "item_list.items: "),
        ({"item_list": ITEMS, "workers": 0}, "workers: "),
        ({"item_list": ITEMS, "timeout": 0}, "timeout: "),
        ({"item_list": ITEMS, "workerz": 2}, "workerz: unknown field"),
        ({"item_list": {**ITEMS, "batchsize": 2}}, "item_list.batchsize: unknown field"),
        ({"item_list": ITEMS, "sqs_dead_letter_queue": {"arn": "x"}},
         "sqs_dead_letter_queue.max_receive_count: field required"),
        ({"item_list": ITEMS, "sqs_dead_letter_queue": {"max_receive_count": 0}},
         "sqs_dead_letter_queue.max_receive_count: "),
        ({"item_list": ITEMS, "config": ["not", "a", "map"]}, "config: "),
    ],
)
def test_every_problem_names_its_field_path(body: dict[str, Any], expected: str) -> None:
    assert error_of(body).startswith(expected)


def test_all_problems_of_a_body_are_reported_together() -> None:
    message = error_of({"item_list": {"items": [], "batch_size": 0}, "workers": 0, "extra": True})

    parts = message.split("; ")
    assert sorted(part.split(":")[0] for part in parts) == [
        "extra", "item_list.batch_size", "item_list.items", "workers"
    ]


def test_a_malformed_file_source_is_reported_by_field_before_being_refused() -> None:
    assert error_of({"delimited_files": {"s3_paths": []}}).startswith("delimited_files.s3_paths: ")


@pytest.mark.parametrize("body", [[], "item_list", None, 3])
def test_a_body_that_is_not_an_object_is_refused(body: Any) -> None:
    assert error_of(body) == "the job submission must be a JSON object"


def test_items_are_split_into_batches_of_batch_size_with_the_rest_last() -> None:
    assert split_items([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]


def test_items_that_fill_their_batches_exactly_leave_no_empty_batch() -> None:
    assert split_items([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_a_batch_size_larger_than_the_items_gives_one_batch() -> None:
    assert split_items(["a", "b"], 100) == [["a", "b"]]


def test_a_batch_size_of_one_gives_a_batch_per_item() -> None:
    assert split_items([{"x": 1}, {"x": 2}], 1) == [[{"x": 1}], [{"x": 2}]]
