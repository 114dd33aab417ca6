"""A large local JSON-lines file parsed by helper processes while the enqueuer cuts it
(`jobs/batch/line_checks.py`): the same ranges and the same errors as the enqueuer alone, the
bytes of the file the enqueuer opened, and a helper that dies costing nothing but speed.

Real helper processes; the size from which they are used and the block size are made small, so
that a small file crosses many blocks and both helpers.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path

import pytest

import jobs.batch.inputs
import jobs.batch.line_checks
from jobs.batch.inputs import EnqueueError, RangeRef, cut_ranges
from jobs.batch.line_checks import HERE, LineChecks
from predictors_runtime.storage import storage_for


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> LineChecks:
    monkeypatch.setattr(jobs.batch.line_checks, "HELPER_MIN_BYTES", 0)
    monkeypatch.setattr(jobs.batch.inputs, "READ_BLOCK", 256)
    return LineChecks(helpers=2)


def written(path: Path, text: str) -> Path:
    path.write_bytes(text.encode())
    return path


def cut(path: Path, batch_size: int, checks: LineChecks | None) -> list[RangeRef]:
    return list(cut_ranges([storage_for(str(path)).stat(str(path))], batch_size, checks or HERE))


def helper_pids(checks: LineChecks) -> list[int]:
    return [helper.process.pid for helper in checks._helpers]


def test_helpers_started_ahead_are_the_ones_the_first_file_uses(tmp_path: Path, checks: LineChecks) -> None:
    checks.start()
    started = helper_pids(checks)
    assert len(started) == 2 and all(helper.alive() for helper in checks._helpers)
    path = written(tmp_path / "in.jsonl", "".join(json.dumps({"n": i}) + "\n" for i in range(40)))

    assert cut(path, 7, checks) == cut(path, 7, None)
    assert helper_pids(checks) == started


@pytest.mark.parametrize("shape", ["plain", "blank lines", "crlf", "no final newline", "long lines"])
def test_ranges_cut_beside_the_helpers_are_those_cut_alone(tmp_path: Path, checks: LineChecks, shape: str) -> None:
    lines = [json.dumps({"n": i, "text": "x" * (300 if shape == "long lines" else i % 5)}) for i in range(60)]
    if shape == "blank lines":
        lines[7:7] = ["", "   "]
    newline = "\r\n" if shape == "crlf" else "\n"
    path = written(tmp_path / "in.jsonl", newline.join(lines) + ("" if shape == "no final newline" else newline))

    alone, beside = cut(path, 7, None), cut(path, 7, checks)

    assert beside == alone and sum(r.lines for r in beside) == 60
    assert all(a.end == b.start for a, b in itertools.pairwise(beside))
    assert len(helper_pids(checks)) == 2 and all(helper.alive() for helper in checks._helpers)


def test_a_malformed_line_is_named_as_the_enqueuer_alone_names_it(tmp_path: Path, checks: LineChecks) -> None:
    lines = [json.dumps({"n": i}) for i in range(200)]
    lines[150] = '{"n": 150'
    path = written(tmp_path / "in.jsonl", "\n".join(lines) + "\n")

    with pytest.raises(EnqueueError) as alone:
        cut(path, 10, None)
    with pytest.raises(EnqueueError) as beside:
        cut(path, 10, checks)

    assert str(beside.value) == str(alone.value) and "line 151: not valid JSON" in str(beside.value)


def test_the_helpers_read_the_file_the_enqueuer_opened_even_if_its_path_was_swapped(
    tmp_path: Path, checks: LineChecks
) -> None:
    path = written(tmp_path / "in.jsonl", "\n".join(json.dumps({"n": i}) for i in range(100)) + "\n")
    swapped = written(tmp_path / "other.jsonl", "not json\n" * 200)
    with open(path, "rb") as stream, checks.lent(stream, path.stat().st_size) as lent:
        os.replace(swapped, path)  # the name now leads to a file of bad lines
        data = stream.read()
        lent.send(data[: data.rfind(b"\n")], 0)

        assert lent.answered() is True  # the helper read the opened file, all JSON values


def test_a_helper_that_dies_mid_file_costs_nothing_but_speed_and_the_next_file_starts_new_ones(
    tmp_path: Path, checks: LineChecks
) -> None:
    good = "\n".join(json.dumps({"n": i}) for i in range(50)).encode()
    bad = b'{"n": 1}\n{"n": '
    path = written(tmp_path / "in.jsonl", (good + b"\n" + bad + b"\n" + good + b"\n").decode())
    blocks = [(good, 0), (bad, len(good) + 1), (good, len(good) + len(bad) + 2)] * 2
    with open(path, "rb") as stream, checks.lent(stream, path.stat().st_size) as lent:
        first = helper_pids(checks)
        for block, offset in blocks[:3]:
            lent.send(block, offset)
        os.kill(first[0], signal.SIGKILL)  # it held the first and the third block
        for block, offset in blocks[3:]:
            lent.send(block, offset)

        answers = [lent.answered() for _ in blocks]

    assert answers == [True, False, True] * 2  # what the dead helper held was parsed here
    assert lent.broken
    with open(path, "rb") as stream, checks.lent(stream, path.stat().st_size):
        assert first[0] not in helper_pids(checks) and len(helper_pids(checks)) == 2


def test_small_files_and_files_of_no_local_disk_are_parsed_by_the_enqueuer_alone(tmp_path: Path) -> None:
    path = written(tmp_path / "in.jsonl", '{"n": 1}\n')
    checks = LineChecks(helpers=2)
    with open(path, "rb") as stream, checks.lent(stream, path.stat().st_size) as lent:
        assert lent.ahead == 0
    assert helper_pids(checks) == []
