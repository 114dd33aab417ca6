"""Matching input files, cutting JSON-lines files into batches, and encoding outputs."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
from pathlib import Path

import orjson
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from foundation.errors import BadRequest, BadStorageUri
from jobs.batch.inputs import EnqueueError, check_local_path, cut_ranges, match_files, matches, read_range
from jobs.batch.outputs import encode_rows, part_uri
from jobs.batch.submission import FileSource
from predictors_runtime.storage import storage_for


@pytest.mark.parametrize(
    ("uri", "includes", "excludes", "kept"),
    [
        ("s3://b/data/x/y.json", ["s3://b/data/**/*.json"], [], True),
        ("s3://b/data/y.json", ["s3://b/data/**/*.json"], [], True),
        ("s3://b/data/x/y.json", ["s3://b/data/*.json"], [], False),  # * stops at /
        ("s3://b/data/y.json", [], [], True),
        ("s3://b/data/y.json", [], ["**/y.json"], False),
        ("s3://b/data/y.json", ["**/*.json"], ["**/*.json"], False),  # keep, then drop
        ("s3://b/data/y.csv", ["**/*.json", "**/*.csv"], [], True),
        ("/srv/in/.hidden.json", ["/srv/in/*.json"], [], True),
    ],
)
def test_globs_keep_then_drop_with_slash_as_separator(uri, includes, excludes, kept):
    assert matches(uri, includes, excludes) is kept


def test_a_local_path_must_be_absolute_and_under_a_root(tmp_path: Path):
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    roots = (str(root),)

    assert check_local_path(str(root / "in"), roots) == os.path.realpath(root / "in")
    with pytest.raises(BadStorageUri, match="outside the allowed local roots"):
        check_local_path(str(root / "in" / ".." / ".." / "other"), roots)
    with pytest.raises(BadStorageUri, match="absolute"):
        check_local_path("relative/path", roots)
    with pytest.raises(BadStorageUri, match="SLUICE_LOCAL_INPUT_ROOTS"):
        check_local_path(str(root / "in"), ())
    with pytest.raises(BadStorageUri):
        check_local_path(str(tmp_path / "root-sibling"), roots)  # a shared prefix is not inside


def test_a_symlink_leading_out_of_a_root_is_refused(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("x")
    os.symlink(outside, root / "link.txt")

    with pytest.raises(BadStorageUri, match="link.txt"):
        check_local_path(str(root / "link.txt"), (str(root),))


def test_matching_files_lists_each_once_sorted_and_refuses_none(tmp_path: Path):
    for name in ("b.jsonl", "a.jsonl", "c.txt"):
        (tmp_path / name).write_text("{}\n")
    source = FileSource(s3_paths=[str(tmp_path), str(tmp_path / "a.jsonl")], includes=["**/*.jsonl"], batch_size=1)

    found = match_files(source, (str(tmp_path),), "delimited_files")

    assert [Path(info.uri).name for info in found] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(BadRequest, match="no files matched"):
        match_files(FileSource(s3_paths=[str(tmp_path)], includes=["*.parquet"], batch_size=1),
                    (str(tmp_path),), "delimited_files")


def test_json_lines_are_cut_into_ranges_that_read_back_to_the_same_items(tmp_path: Path):
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"n": i}) for i in range(23)]
    lines.insert(5, "")  # blank lines are skipped, not items
    path.write_text("\n".join(lines) + "\n")
    info = storage_for(str(path)).stat(str(path))

    ranges = list(cut_ranges([info], batch_size=10))

    assert [r.lines for r in ranges] == [10, 10, 3]
    assert ranges[0].start == 0 and ranges[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    items = [item for r in ranges for item in read_range(r.to_dict())]
    assert items == [{"n": i} for i in range(23)]


@pytest.mark.parametrize("block", [5, 64, 1 << 20])
@pytest.mark.parametrize("batch_size", [1, 3, 7])
@pytest.mark.parametrize("shape", ["plain", "blank lines", "crlf", "no final newline", "long lines"])
def test_ranges_cover_the_file_whatever_the_blocks_and_lines(tmp_path, monkeypatch, block, batch_size, shape):
    """Blocks are read whole; lines across block edges, blank lines and a missing last newline still cut right."""
    import jobs.batch.inputs

    monkeypatch.setattr(jobs.batch.inputs, "READ_BLOCK", block)
    items = [{"n": i, "text": "x" * (200 if shape == "long lines" else i % 4)} for i in range(20)]
    lines = [json.dumps(item) for item in items]
    newline = "\r\n" if shape == "crlf" else "\n"
    if shape == "blank lines":
        lines[3:3] = ["", "   "]
        lines.append("")
    text = newline.join(lines) + ("" if shape == "no final newline" else newline)
    path = tmp_path / "in.jsonl"
    path.write_bytes(text.encode())
    info = storage_for(str(path)).stat(str(path))

    ranges = list(cut_ranges([info], batch_size=batch_size))

    assert ranges[0].start == 0 and text.encode()[ranges[-1].end:].strip() == b""  # at most blank lines left
    assert all(a.end == b.start for a, b in itertools.pairwise(ranges))
    tail = [20 % batch_size] if 20 % batch_size else []
    assert [r.lines for r in ranges] == [batch_size] * (20 // batch_size) + tail
    assert [item for r in ranges for item in read_range(r.to_dict())] == items
    first_lines = [r.first_line for r in ranges]
    assert first_lines == sorted(first_lines) and first_lines[0] == 1


@pytest.mark.parametrize("block", [5, 1 << 20])
def test_a_malformed_line_is_found_in_any_block(tmp_path, monkeypatch, block):
    import jobs.batch.inputs

    monkeypatch.setattr(jobs.batch.inputs, "READ_BLOCK", block)
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(['{"n": 1}'] * 30 + ['{"n": 1,}'] + ['{"n": 1}'] * 5) + "\n")
    info = storage_for(str(path)).stat(str(path))

    with pytest.raises(EnqueueError, match=r"in.jsonl: line 31: not valid JSON"):
        list(cut_ranges([info], batch_size=4))


def test_what_the_workers_parser_accepts_is_accepted_when_enqueueing(tmp_path: Path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"n": 1}\n{"big": 123456789012345678901234567890}\n{"n": 3}\n')
    info = storage_for(str(path)).stat(str(path))

    (ref,) = cut_ranges([info], batch_size=10)

    assert ref.lines == 3
    assert read_range(ref.to_dict())[1] == orjson.loads(b'{"big": 123456789012345678901234567890}')


@pytest.mark.parametrize(("lines", "bad"), [
    # Not JSON line by line, yet `[` + the lines joined by commas + `]` is an array of 3 items.
    ([b"1,2", b"[3", b"4]"], 1),
    ([b'{"n": 1}', b'"a', b'b"', b"1,2"], 2),
    ([b'{"n": 1}', b'{"a": 1} {"b": 2}'], 2),  # two documents on one line
    ([b'{"n": 1}', b'"\xff"'], 2),  # not UTF-8
])
def test_every_line_must_be_one_json_document_whatever_its_neighbours(tmp_path: Path, lines, bad):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    info = storage_for(str(path)).stat(str(path))

    with pytest.raises(EnqueueError, match=rf"in.jsonl: line {bad}: not valid JSON"):
        list(cut_ranges([info], batch_size=10))


def test_a_range_whose_file_changed_since_enqueueing_is_refused_not_misread(tmp_path: Path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"n": 1}\n{"n": 2}\n')
    info = storage_for(str(path)).stat(str(path))
    (ref,) = cut_ranges([info], batch_size=10)
    path.write_text('{"n": 1, "m": [1,\n2]}\n')

    with pytest.raises(ValueError, match="hold 1 items, not the 2|not valid JSON any more"):
        read_range(ref.to_dict())


def test_a_malformed_line_names_its_file_and_line_number(tmp_path: Path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"n": 1}\n{"n": 2}\n{"n": \n')
    info = storage_for(str(path)).stat(str(path))

    with pytest.raises(EnqueueError, match=r"in.jsonl: line 3: not valid JSON"):
        list(cut_ranges([info], batch_size=100))


def test_rows_encode_to_each_format_and_non_dict_rows_become_a_value_column():
    rows = [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]

    assert [json.loads(line) for line in encode_rows(rows, "jsonl").decode().splitlines()] == rows
    assert pq.read_table(io.BytesIO(encode_rows(rows, "parquet"))).to_pylist() == rows
    assert pa_csv.read_csv(io.BytesIO(encode_rows(rows, "csv"))).to_pylist() == rows  # types read back too
    assert pq.read_table(io.BytesIO(encode_rows([1, 2], "parquet"))).to_pylist() == [{"value": 1}, {"value": 2}]
    assert encode_rows([1, 2], "csv") == b"value\n1\n2\n"


def test_csv_has_a_plain_header_and_every_value_in_one_cell():
    rows = [
        {"id": 1, "label": 'said "hi", then\nleft', "ok": True, "scores": {"a": [1, 2]}},
        {"id": 2, "label": None, "ok": False, "scores": [0.5, "x"], "b,c": "only here"},
        {"id": 3, "mixed": 1},
        {"id": 4, "mixed": "one"},
    ]

    data = encode_rows(rows, "csv")

    assert data.startswith(b'id,label,ok,scores,"b,c",mixed\n')  # first-appearance order; quoted where needed
    assert data.splitlines()[1].startswith(b"1,")  # numbers bare, so readers take them for numbers
    read = list(csv.DictReader(io.StringIO(data.decode(), newline="")))
    assert [row["id"] for row in read] == ["1", "2", "3", "4"]
    assert read[0]["label"] == 'said "hi", then\nleft'
    scores = [json.loads(row["scores"]) if row["scores"] else None for row in read]
    assert scores == [{"a": [1, 2]}, [0.5, "x"], None, None]
    assert [row["ok"] for row in read] == ["true", "false", "", ""]
    assert [row["mixed"] for row in read] == ["", "", "1", "one"]  # a column of mixed types is text
    assert [row["b,c"] for row in read] == ["", "only here", "", ""]  # a key of a later row is a column too
    assert encode_rows([], "csv") == encode_rows([{}], "csv") == b"\n"


def test_parquet_columns_are_every_key_of_every_row():
    rows = [{"a": 1}, {"a": 2, "b": "later"}]

    assert pq.read_table(io.BytesIO(encode_rows(rows, "parquet"))).to_pylist() == [
        {"a": 1, "b": None}, {"a": 2, "b": "later"},
    ]


def test_part_paths_sort_in_batch_order():
    output = {"path": "s3://bucket/out", "format": "parquet"}

    assert part_uri(output, "job1", 7) == "s3://bucket/out/job1/part-00007.parquet"
    assert part_uri(output, "job1", 7) < part_uri(output, "job1", 10)


def test_a_part_is_written_inside_its_root_and_an_output_folder_swapped_for_a_link_out_is_refused(tmp_path: Path):
    from foundation.errors import AccessDenied
    from jobs.batch.outputs import write_part

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    output = {"path": str(root / "out"), "format": "jsonl"}
    assert write_part(output, "job1", 0, [{"a": 1}], local_roots=(str(root),)) == 1
    assert (root / "out" / "job1" / "part-00000.jsonl").read_text() == '{"a": 1}\n'

    # After the submission was checked, the job's folder becomes a link leading out of the root.
    (root / "out" / "job2").symlink_to(outside, target_is_directory=True)
    with pytest.raises(AccessDenied, match="outside the allowed local roots"):
        write_part(output, "job2", 0, [{"a": 2}], local_roots=(str(root),))
    assert list(outside.iterdir()) == []
    # A part swapped for a link to a file outside is replaced, not written through.
    target = outside / "victim"
    target.write_text("keep")
    (root / "out" / "job1" / "part-00001.jsonl").symlink_to(target)
    write_part(output, "job1", 1, [{"a": 3}], local_roots=(str(root),))
    assert target.read_text() == "keep"
    assert (root / "out" / "job1" / "part-00001.jsonl").read_text() == '{"a": 3}\n'
    # Without roots on the worker, local outputs are refused outright.
    with pytest.raises(AccessDenied, match="not allowed"):
        write_part(output, "job1", 2, [1], local_roots=())
