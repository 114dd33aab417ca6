"""Structured logs: JSON lines with Sluice's keys, the job's labels and the predictor's `extra=` fields."""

from __future__ import annotations

import io
import json
import logging

import pytest

from foundation import json_logs as sluice_log
from foundation.json_logs import JsonLinesHandler, labelled, logger


@pytest.fixture
def lines():
    stream = io.StringIO()
    handler = JsonLinesHandler(stream)
    base = logging.getLogger("sluice.predictor")
    base.addHandler(handler)
    base.setLevel(logging.DEBUG)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    base.removeHandler(handler)


def test_a_line_has_sluices_keys_and_the_extra_fields_at_the_top_level(lines):
    logger.info("received payload", extra={"payload": "this movie is awesome", "scores": {"a": 1}})

    (line,) = lines()
    assert line["message"] == "received payload"
    assert line["levelname"] == "INFO"
    assert isinstance(line["process"], int) and line["asctime"]
    assert line["payload"] == "this movie is awesome"
    assert line["scores"] == {"a": 1}  # flattened one level only


def test_reserved_keys_in_extra_are_dropped_instead_of_overriding_or_raising(lines):
    logger.warning("careful", extra={"message": "x", "levelname": "x", "process": "x", "labels": "x", "asctime": "x",
                                     "kept": True})

    (line,) = lines()
    assert (line["message"], line["levelname"], line["kept"]) == ("careful", "WARNING", True)
    assert isinstance(line["process"], int) and "labels" not in line and line["asctime"] != "x"


def test_lines_logged_for_a_job_carry_its_labels(lines):
    with labelled(job_id="j1"), labelled(batch_index="3"):
        logger.info("inside")
    logger.info("outside")

    inside, outside = lines()
    assert inside["labels"] == {"job_id": "j1", "batch_index": "3"}
    assert "labels" not in outside


def test_a_worker_nodes_lines_carry_its_name_under_the_labels_of_the_moment(lines, monkeypatch):
    monkeypatch.setattr(sluice_log, "_process_labels", {})
    sluice_log.set_process_labels(node="worker1@host-a")
    with labelled(job_id="j1"):
        logger.info("inside")
    logger.info("outside")

    inside, outside = lines()
    assert inside["labels"] == {"node": "worker1@host-a", "job_id": "j1"}
    assert outside["labels"] == {"node": "worker1@host-a"}


def test_a_line_over_the_limit_is_dropped(lines, monkeypatch):
    monkeypatch.setattr(sluice_log, "MAX_LINE_BYTES", 1000)

    logger.info("big", extra={"blob": "x" * 2000})
    logger.info("small")

    assert [line["message"] for line in lines()] == ["small"]


def test_an_exception_is_kept_in_the_line(lines):
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")

    (line,) = lines()
    assert "ValueError: boom" in line["exception"]
