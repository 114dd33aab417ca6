"""The job hash is named in one place (`jobs.store.JobField`): every field a Lua script touches is one of
them, the scripts ship with the package, and both stores read a hash back the same way."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from jobs.batch.job import Job, JobStatus
from jobs.store import JobField, scripts
from jobs.store.schema import job_state, new_job_hash

ROOT = Path(__file__).resolve().parents[2]
# A call on the job's own hash (KEYS[1]) and everything up to its closing parenthesis.
JOB_HASH_CALL = re.compile(r"redis\.call\('(?P<command>H[A-Z]+)', KEYS\[1\](?P<rest>[^)]*)\)")
LITERAL = re.compile(r"'([^']*)'")


def fields_touched(source: str) -> set[str]:
    return {name for call in JOB_HASH_CALL.finditer(source) for name in LITERAL.findall(call["rest"])}


@pytest.mark.parametrize("name", scripts.SCRIPTS)
def test_every_field_a_script_touches_on_the_job_hash_is_a_jobfield(name: str) -> None:
    touched = fields_touched(scripts.source(name))

    assert touched, f"{name}.lua touches no field of the job hash?"
    assert touched <= {field.value for field in JobField}, touched - {field.value for field in JobField}


def test_the_fields_found_are_those_of_the_calls_including_every_pair_of_a_multi_field_hset() -> None:
    source = "redis.call('HSET', KEYS[1], 'status', ARGV[1], 'moved_by', ARGV[4])\nredis.call('SADD', KEYS[2], 'x')"

    assert fields_touched(source) == {"status", "moved_by"}


def test_every_script_is_a_file_of_the_package_and_the_distribution_ships_them() -> None:
    folder = ROOT / "jobs" / "store" / "lua"

    assert sorted(path.stem for path in folder.glob("*.lua")) == sorted(scripts.SCRIPTS)
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["jobs.store"] == [
        "lua/*.lua"]
    with pytest.raises(ValueError, match="no store script named 'nope'"):
        scripts.source("nope")


def test_every_field_is_described() -> None:
    source = (ROOT / "jobs" / "store" / "schema.py").read_text()

    for field in JobField:
        assert re.search(rf'{field.name} = "{field.value}"\n    """', source), f"{field.name} has no docstring"


def test_a_new_jobs_hash_reads_back_as_the_job_with_nothing_recorded() -> None:
    job = Job(job_id="j", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=2, start_time=5.0)

    state = job_state(new_job_hash(job, JobStatus.RUNNING))

    assert (state.job, state.status, state.succeeded, state.failed, state.time_total) == (
        job, JobStatus.RUNNING, 0, 0, 0)
    assert (state.nodes, state.finishing_at, state.completion_claimed, state.hook_message, state.sealed_total) == (
        [], None, False, None, None)


def test_a_damaged_field_raises_one_of_the_errors_steps_skip_a_record_for() -> None:
    from jobs.batch.job import BAD_RECORD_ERRORS

    job = Job(job_id="j", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=2, start_time=5.0)
    for field, text in [(JobField.RECORD, "{not json"), (JobField.SUCCEEDED, "many"), (JobField.STATUS, "done")]:
        fields = {**new_job_hash(job, JobStatus.RUNNING), field: text}
        with pytest.raises(BAD_RECORD_ERRORS):
            job_state(fields)
