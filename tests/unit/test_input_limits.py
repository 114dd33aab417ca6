"""Limits at the edge: job submission numbers, JSON bodies, project bundles, the bundle cache,
and local inputs opened by workers confined to the allowed roots."""

from __future__ import annotations

import io
import json
import os
import tarfile
import typing
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel

from api.json_body import MAX_JSON_DEPTH, parse_json_body
from foundation.errors import AccessDenied, BadRequest, ConfigError
from jobs.batch.inputs import RangeRef, read_range
from jobs.batch.submission import JobRequest, parse_job_request
from predictors_runtime.bundles import BundleStore
from predictors_runtime.project import (
    MAX_BUNDLE_FILES,
    MAX_UNPACKED_BYTES,
    BundleLimits,
    bundle_digest,
    pack_project,
    unpack_project,
)
from predictors_runtime.storage.local import open_confined
from tests.hostile import bundle_declaring

ITEMS = {"items": [1, 2, 3], "batch_size": 2}


def refused(body: Any) -> str:
    with pytest.raises(BadRequest) as info:
        parse_job_request(body)
    return info.value.message


# -- numbers of a submission --------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "field", "allowed"),
    [
        ({"item_list": ITEMS, "workers": 1001}, "workers", "from 1 to 1000"),
        ({"item_list": {"items": [1], "batch_size": 1_000_001}}, "item_list.batch_size", "from 1 to 1000000"),
        ({"delimited_files": {"s3_paths": ["s3://b/x"], "batch_size": 0}}, "delimited_files.batch_size",
         "from 1 to 1000000"),
        ({"item_list": ITEMS, "timeout": 30 * 24 * 3600 + 1}, "timeout", "from 1 to 2592000"),
        ({"item_list": ITEMS, "sqs_dead_letter_queue": {"max_receive_count": 10**20}},
         "sqs_dead_letter_queue.max_receive_count", "from 1 to 1000"),
        ({"item_list": ITEMS, "batch_timeout": 10**9}, "batch_timeout", "greater than 0 and at most 86400"),
    ],
)
def test_a_number_out_of_its_range_is_refused_naming_the_field_and_the_range(body, field, allowed):
    assert refused(body).startswith(f"{field}: must be {allowed} (got ")


def test_a_401_digit_timeout_is_refused_without_repeating_it():
    message = refused({"item_list": ITEMS, "timeout": int("9" * 401)})

    assert message == "timeout: must be from 1 to 2592000 (got an integer of 401 digits)"


def test_the_largest_allowed_numbers_are_accepted():
    request = parse_job_request({
        "item_list": {"items": [1], "batch_size": 1_000_000}, "workers": 1000, "timeout": 2_592_000,
        "sqs_dead_letter_queue": {"max_receive_count": 1000},
    })

    assert (request.workers, request.timeout, request.tries) == (1000, 2_592_000, 1000)


def _numeric_fields(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        types = (field.annotation, *typing.get_args(field.annotation))
        for kind in types:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _numeric_fields(kind, f"{prefix}{name}.")
        if any(kind in (int, float) for kind in types):
            yield f"{prefix}{name}", field


def test_every_number_of_a_submission_has_a_lower_and_an_upper_bound():
    """A field added later without bounds (`Field(ge=..., le=...)`) fails here, not in beat."""
    fields = dict(_numeric_fields(JobRequest))
    assert {"workers", "timeout", "item_list.batch_size", "sqs_dead_letter_queue.max_receive_count"} <= set(fields)
    for name, field in fields.items():
        rules = field.metadata
        assert any(isinstance(r, (annotated_types.Ge, annotated_types.Gt)) for r in rules), f"{name}: no lower bound"
        assert any(isinstance(r, (annotated_types.Le, annotated_types.Lt)) for r in rules), f"{name}: no upper bound"


@pytest.mark.parametrize("path", ["/in/a\x00b.jsonl", "/in/\ud800.jsonl"])
@pytest.mark.parametrize("where", ["s3_paths", "includes"])
def test_a_nul_or_a_lone_surrogate_in_a_path_is_refused_naming_the_field(path, where):
    source = {"s3_paths": ["s3://b/x"], "batch_size": 1, where: [path]}

    message = refused({"delimited_files": source})

    assert message.startswith(f"delimited_files.{where}[0]: must ")
    assert "NUL" in message or "surrogate" in message


def test_an_output_path_with_a_nul_is_refused():
    assert refused({"item_list": ITEMS, "output": {"path": "/out/\x00"}}).startswith("output.path: must not contain")


# -- JSON bodies --------------------------------------------------------------------------------

def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def body_refusal(raw: bytes) -> str:
    with pytest.raises(BadRequest) as info:
        parse_json_body(raw)
    return info.value.message


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 990, 1000, 5000, 200_000])
def test_a_body_nested_deeper_than_the_limit_is_refused_naming_it(depth):
    assert "nested deeper than the limit of 64 levels" in body_refusal(nested(depth).encode())


@pytest.mark.parametrize("where", ["items", "config"])
def test_deep_nesting_inside_items_or_config_is_refused(where):
    deep = nested(995)
    body = (f'{{"item_list": {{"items": [{deep}], "batch_size": 1}}}}' if where == "items"
            else f'{{"item_list": {{"items": [1], "batch_size": 1}}, "config": {{"k": {deep}}}}}')

    assert "nested deeper than the limit" in body_refusal(body.encode())


def test_nesting_up_to_the_limit_is_read_and_brackets_inside_strings_do_not_count():
    assert parse_json_body(nested(MAX_JSON_DEPTH).encode()) is not None
    body = json.dumps({"config": {"text": "[" * 5000 + "{" * 5000, "quote": 'a"[[[\\'}})

    assert parse_json_body(body.encode())["config"]["text"].startswith("[[[")


def test_a_100000_digit_integer_is_refused_as_a_bad_request():
    message = body_refusal(b'{"item_list": {"items": [' + b"9" * 100_000 + b'], "batch_size": 1}}')

    assert "more than the limit of 4300 digits" in message


def test_a_lone_surrogate_anywhere_is_refused_naming_the_field():
    raw = b'{"delimited_files": {"s3_paths": ["/in/\\ud800.jsonl"], "batch_size": 1}}'

    assert body_refusal(raw).startswith("delimited_files.s3_paths[0]: not valid Unicode text")
    assert body_refusal(b'{"config": {"\\udfff": 1}}').startswith("config (a key): not valid Unicode")


def test_a_surrogate_pair_is_text_and_is_kept():
    assert parse_json_body(b'{"k": "\\ud83d\\ude00"}') == {"k": "\U0001F600"}


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", "{}".encode("utf-16"), b'{"a": "\xed\xa0\x80"}', b"{not json"])
def test_bodies_that_are_not_utf8_json_are_bad_requests(raw):
    message = body_refusal(raw)

    assert "not UTF-8" in message or "not valid JSON" in message


# -- project bundles ----------------------------------------------------------------------------

def bundle_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_one_megabyte_upload_holding_a_gibibyte_file_is_refused_before_anything_is_written(tmp_path):
    bomb = bundle_declaring("weights.bin", MAX_UNPACKED_BYTES + (1 << 20))
    assert len(bomb) < 2 << 20

    with pytest.raises(ConfigError) as info:
        unpack_project(bomb, tmp_path / "dest")

    assert f"unpacks to more than {MAX_UNPACKED_BYTES} bytes" in info.value.message
    assert "SLUICE_MAX_UNPACKED_BUNDLE_BYTES" in info.value.message
    assert not (tmp_path / "dest").exists()
    with pytest.raises(ConfigError, match="unpacks to more than"):
        bundle_digest(bomb)


def test_the_unpacked_size_counts_every_file_together(tmp_path):
    data = bundle_of({"a.bin": bytes(600), "b.bin": bytes(600)})

    with pytest.raises(ConfigError, match="more than 1000 bytes .* reached at 'b.bin'"):
        unpack_project(data, tmp_path / "dest", BundleLimits(unpacked_bytes=1000))
    assert unpack_project(data, tmp_path / "ok", BundleLimits(unpacked_bytes=1200)) == 1200


def test_a_bundle_of_too_many_files_is_refused_naming_the_limit(tmp_path):
    data = bundle_of({f"f{i}.txt": b"x" for i in range(11)})

    with pytest.raises(ConfigError) as info:
        unpack_project(data, tmp_path / "dest", BundleLimits(files=10))

    assert "more than 10 files and folders" in info.value.message
    assert "SLUICE_MAX_BUNDLE_FILES" in info.value.message
    assert not (tmp_path / "dest").exists()
    assert MAX_BUNDLE_FILES == 100_000


def test_a_sparse_member_is_refused(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("holes.bin")
        info.type = tarfile.GNUTYPE_SPARSE
        info.size = 0
        tar.addfile(info)

    with pytest.raises(ConfigError, match="sparse"):
        unpack_project(buffer.getvalue(), tmp_path / "dest")


# -- the bundle cache ---------------------------------------------------------------------------

def project_bundle(folder: Path, size: int) -> bytes:
    folder.mkdir(parents=True)
    (folder / "predictor.py").write_text(f"# {folder.name}\n")
    (folder / "weights.bin").write_bytes(os.urandom(size))
    return pack_project(folder)


@pytest.fixture
def make_store(tmp_path):
    def make(cache_bytes: int) -> BundleStore:
        return BundleStore(str(tmp_path / "storage"), tmp_path / "cache", cache_bytes=cache_bytes)
    return make


def cached(tmp_path: Path) -> set[str]:
    folder = tmp_path / "cache" / "bundles"
    return {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")}


def age(store: BundleStore, digest: str, seconds_ago: float) -> None:
    folder = store.local_folder(digest)
    store.release(digest)
    os.utime(folder, (folder.stat().st_atime, folder.stat().st_mtime - seconds_ago))


def test_the_least_recently_used_bundles_are_evicted_beyond_the_cache_bound(tmp_path, make_store):
    store = make_store(cache_bytes=250_000)
    a, b, c = (store.put(project_bundle(tmp_path / n, 100_000)) for n in "abc")
    age(store, a, 300)
    age(store, b, 200)

    store.local_folder(c)

    assert cached(tmp_path) == {b, c}
    assert not (tmp_path / "cache" / "bundles" / a).exists()


def test_using_a_bundle_makes_it_recent_again(tmp_path, make_store):
    store = make_store(cache_bytes=250_000)
    a, b, c = (store.put(project_bundle(tmp_path / n, 100_000)) for n in "abc")
    age(store, a, 300)
    age(store, b, 200)
    before = (tmp_path / "cache" / "bundles" / a).stat().st_mtime

    store.local_folder(a)  # used again: b is now the least recently used
    store.release(a)
    store.local_folder(c)

    assert (tmp_path / "cache" / "bundles" / a).stat().st_mtime > before
    assert cached(tmp_path) == {a, c}


def test_a_bundle_in_use_by_this_process_is_never_evicted(tmp_path, make_store):
    store = make_store(cache_bytes=1)
    a, b = (store.put(project_bundle(tmp_path / n, 50_000)) for n in "ab")
    folder = store.local_folder(a)  # held, not released

    store.local_folder(b)

    assert (folder / "predictor.py").is_file()
    store.release(a)
    store.release(b)
    assert set(store.evict()) == {a, b}  # once nobody holds them
    assert not folder.exists()


# A bundle held by another process: tests/integration/test_bundle_cache_processes.py.


# -- local inputs opened by workers -------------------------------------------------------------

@pytest.fixture
def roots(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "rows.jsonl").write_text('{"n":1}\n{"n":2}\n')
    (outside / "secret.jsonl").write_text('{"s":1}\n{"s":2}\n')  # the same bytes per line
    return root, outside


def ref_of(path: Path) -> dict[str, Any]:
    return RangeRef(str(path), 0, path.stat().st_size, 2, 1).to_dict()


def test_a_file_swapped_for_a_link_out_of_the_root_after_submission_is_not_read(roots):
    root, outside = roots
    ref = ref_of(root / "rows.jsonl")  # checked and cut when the job was submitted
    (root / "rows.jsonl").unlink()
    (root / "rows.jsonl").symlink_to(outside / "secret.jsonl")

    with pytest.raises(AccessDenied) as info:
        read_range(ref, (str(root),))

    assert info.value.message.startswith(f"{root / 'rows.jsonl'}: refused, it leads outside the allowed local roots")
    assert str(root) in info.value.message
    assert "secret" not in info.value.message


def test_a_folder_swapped_for_a_link_out_of_the_root_is_not_read(roots):
    root, outside = roots
    (root / "day").mkdir()
    (root / "day" / "secret.jsonl").write_text('{"n":1}\n{"n":2}\n')
    ref = ref_of(root / "day" / "secret.jsonl")
    (root / "day" / "secret.jsonl").unlink()
    (root / "day").rmdir()
    (root / "day").symlink_to(outside)

    with pytest.raises(AccessDenied, match="outside the allowed local roots"):
        read_range(ref, (str(root),))


def test_a_link_that_stays_inside_a_root_is_read_as_at_submission(roots):
    root, _ = roots
    (root / "alias.jsonl").symlink_to(root / "rows.jsonl")

    assert read_range(ref_of(root / "alias.jsonl"), (str(root),)) == [{"n": 1}, {"n": 2}]


def test_a_worker_without_allowed_roots_reads_no_local_file(roots):
    root, _ = roots

    with pytest.raises(AccessDenied, match="SLUICE_LOCAL_INPUT_ROOTS"):
        read_range(ref_of(root / "rows.jsonl"), ())


def test_a_fifo_swapped_in_is_refused_without_blocking(roots):
    root, _ = roots
    os.mkfifo(root / "pipe.jsonl")

    with pytest.raises(AccessDenied, match="not a regular file"):
        open_confined(str(root / "pipe.jsonl"), (str(root),))
