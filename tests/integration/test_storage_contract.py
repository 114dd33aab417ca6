"""One storage contract, kept by every backend: local folders, S3 (moto server) and GCS (emulator).

Each test below runs once per backend through the `root` fixture, which yields a fresh root URI.
"""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from foundation.errors import AccessDenied, BadStorageUri, StorageError, StorageNotFound
from predictors_runtime.storage import ObjectInfo, join_uri, split_uri, storage_for

pytestmark = pytest.mark.integration


def _write_tree(root: str, files: dict[str, bytes]) -> None:
    storage = storage_for(root)
    for name, data in files.items():
        storage.write_bytes(join_uri(root, name), data)


def _other_bucket(root: str) -> str:
    scheme, _, key = split_uri(root)
    return f"{scheme}://sluice-missing-{uuid.uuid4().hex[:12]}/{key}"


# --- reading and writing ------------------------------------------------------------------------

def test_bytes_written_can_be_read_back(root: str) -> None:
    storage = storage_for(root)
    uri = join_uri(root, "models", "a.bin")
    storage.write_bytes(uri, b"\x00model bytes\xff")
    assert storage.read_bytes(uri) == b"\x00model bytes\xff"
    storage.write_bytes(uri, b"")
    assert storage.read_bytes(uri) == b""


def test_a_byte_range_reads_only_those_bytes(root: str) -> None:
    storage = storage_for(root)
    uri = join_uri(root, "digits.txt")
    storage.write_bytes(uri, b"0123456789")
    assert storage.read_range(uri, 2, 5) == b"234"
    assert storage.read_range(uri, 0, 10) == b"0123456789"
    assert storage.read_range(uri, 8, 100) == b"89"  # short past the end, like a file
    assert storage.read_range(uri, 20, 30) == b""
    assert storage.read_range(uri, 4, 4) == b""


def test_open_read_streams_an_object_line_by_line(root: str) -> None:
    storage = storage_for(root)
    uri = join_uri(root, "items.jsonl")
    lines = [f'{{"item": {i}, "pad": "{"x" * (i % 97)}"}}\n'.encode() for i in range(5000)]  # ~300 KB
    storage.write_bytes(uri, b"".join(lines))
    with storage.open_read(uri) as f:
        assert f.readline() == lines[0]
        assert list(f) == lines[1:]
    with storage.open_read(uri) as f:
        assert f.read(7) == lines[0][:7]
        assert f.read() == b"".join(lines)[7:]


def test_stat_gives_the_size_and_a_version_that_changes_with_the_content(root: str) -> None:
    storage = storage_for(root)
    uri = join_uri(root, "model.onnx")
    storage.write_bytes(uri, b"first")
    first = storage.stat(uri)
    assert first == ObjectInfo(uri=storage.canonical(uri), size=5, version=first.version)
    assert first.version
    storage.write_bytes(uri, b"second!")
    second = storage.stat(uri)
    assert second.size == 7
    assert second.version != first.version


def test_exists_is_true_only_for_objects(root: str) -> None:
    storage = storage_for(root)
    uri = join_uri(root, "folder", "file.txt")
    assert not storage.exists(uri)
    storage.write_bytes(uri, b"x")
    assert storage.exists(uri)
    assert not storage.exists(join_uri(root, "folder"))  # a folder is not an object
    assert not storage.exists(join_uri(root, "folder", "other.txt"))


# --- listing ------------------------------------------------------------------------------------

TREE = {
    "b.txt": b"b",
    "a.txt": b"a",
    "sub/deep/deeper/c.bin": b"ccc",
    "sub/z.txt": b"zz",
    "sub-sibling.txt": b"-",  # "-" sorts before "/": order must be by full URI, not by walk
}


def test_listing_a_folder_gives_every_object_under_it_sorted_and_nothing_beside_it(root: str) -> None:
    storage = storage_for(root)
    _write_tree(root, TREE)
    storage.write_bytes(root + "2/not-mine.txt", b"sibling folder")
    storage.write_bytes(root + "-x", b"sibling object")

    listed = list(storage.list(root))
    expected = sorted(storage.canonical(join_uri(root, name)) for name in TREE)
    assert [info.uri for info in listed] == expected
    assert [info.uri for info in listed] == sorted(info.uri for info in listed)
    assert {info.uri: info.size for info in listed} == {
        storage.canonical(join_uri(root, name)): len(data) for name, data in TREE.items()
    }
    assert [info.uri for info in storage.list(root + "/")] == expected
    assert [info.uri for info in storage.list(join_uri(root, "sub"))] == [
        storage.canonical(join_uri(root, "sub/deep/deeper/c.bin")),
        storage.canonical(join_uri(root, "sub/z.txt")),
    ]


def test_listing_an_object_uri_gives_that_object(root: str) -> None:
    storage = storage_for(root)
    _write_tree(root, TREE)
    uri = join_uri(root, "sub", "z.txt")
    assert list(storage.list(uri)) == [storage.stat(uri)]


def test_listing_where_nothing_is_gives_nothing(root: str) -> None:
    storage = storage_for(root)
    assert list(storage.list(root)) == []
    _write_tree(root, {"a.txt": b"a"})
    assert list(storage.list(join_uri(root, "a"))) == []  # a prefix of a name is not a folder
    assert list(storage.list(join_uri(root, "nothing", "here"))) == []


def test_downloading_a_folder_recreates_its_tree(root: str, tmp_path: Path) -> None:
    storage = storage_for(root)
    _write_tree(root, TREE)
    dest = tmp_path / "download"
    written = storage.download_folder(root, dest)
    assert written == [dest / name for name in sorted(TREE, key=lambda n: storage.canonical(join_uri(root, n)))]
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*") if p.is_file()} == TREE

    single = storage.download_folder(join_uri(root, "sub", "z.txt"), tmp_path / "single")
    assert single == [tmp_path / "single" / "z.txt"]
    assert single[0].read_bytes() == b"zz"


def test_downloading_nothing_is_not_found(root: str, tmp_path: Path) -> None:
    with pytest.raises(StorageNotFound, match="nothing"):
        storage_for(root).download_folder(join_uri(root, "nothing"), tmp_path / "dest")


# --- errors -------------------------------------------------------------------------------------

def test_a_missing_object_is_not_found_naming_its_uri(root: str) -> None:
    storage = storage_for(root)
    storage.write_bytes(join_uri(root, "present.txt"), b"here")
    uri = join_uri(root, "absent.txt")
    for read in (storage.read_bytes, storage.stat, storage.open_read, lambda u: storage.read_range(u, 0, 3)):
        with pytest.raises(StorageNotFound) as caught:
            read(uri)
        assert uri in str(caught.value)


def test_a_missing_bucket_is_not_found(root: str) -> None:
    if not split_uri(root)[0]:
        pytest.skip("local storage has no buckets")
    storage = storage_for(root)
    uri = join_uri(_other_bucket(root), "a.txt")
    for call in (storage.read_bytes, storage.stat, storage.open_read, lambda u: list(storage.list(u)),
                 lambda u: storage.write_bytes(u, b"x")):
        with pytest.raises(StorageNotFound) as caught:
            call(uri)
        assert uri in str(caught.value)
    assert not storage.exists(uri)


def test_an_unknown_scheme_is_a_bad_uri_naming_it() -> None:
    with pytest.raises(BadStorageUri, match="'hdfs'"):
        storage_for("hdfs://cluster/models")


@pytest.mark.parametrize("uri", ["s3://", "s3:///key", "gs://", "gs:///models/a.onnx", "s3:bucket/key"])
def test_a_uri_without_a_bucket_is_bad(uri: str) -> None:
    with pytest.raises(BadStorageUri):
        split_uri(uri)
    with pytest.raises(BadStorageUri):
        storage_for(uri).stat(uri)


def test_s3_access_denied_is_access_denied(s3_server: str) -> None:
    import boto3
    from botocore.stub import Stubber

    from predictors_runtime.storage.s3 import S3Storage

    storage = S3Storage()
    client = boto3.client("s3")
    storage._client, storage._pid = client, os.getpid()
    with Stubber(client) as stub:
        stub.add_client_error("head_object", service_error_code="AccessDenied", http_status_code=403)
        stub.add_client_error("get_object", service_error_code="InvalidAccessKeyId", http_status_code=403)
        with pytest.raises(AccessDenied, match="s3://locked/model.onnx"):
            storage.stat("s3://locked/model.onnx")
        with pytest.raises(AccessDenied, match="s3://locked/model.onnx"):
            storage.read_bytes("s3://locked/model.onnx")


def test_missing_credentials_and_refusals_map_to_access_denied() -> None:
    from botocore.exceptions import NoCredentialsError
    from google.api_core import exceptions as google_errors

    from predictors_runtime.storage import gcs, s3

    assert isinstance(s3.translate(NoCredentialsError(), "s3://b/k"), AccessDenied)
    assert isinstance(gcs.translate(google_errors.Forbidden("no"), "gs://b/k"), AccessDenied)
    assert isinstance(gcs.translate(google_errors.Unauthorized("no"), "gs://b/k"), AccessDenied)
    assert isinstance(gcs.translate(google_errors.NotFound("no"), "gs://b/k"), StorageNotFound)
    assert isinstance(gcs.translate(google_errors.InternalServerError("boom"), "gs://b/k"), StorageError)


# --- URIs and the registry ----------------------------------------------------------------------

def test_uris_split_and_join_the_same_way_on_every_scheme(tmp_path: Path) -> None:
    assert split_uri("s3://bucket/a/b.json") == ("s3", "bucket", "a/b.json")
    assert split_uri("gs://bucket") == ("gs", "bucket", "")
    assert split_uri(f"file://{tmp_path}/x") == ("", "", f"{tmp_path}/x")
    assert split_uri("relative/x") == ("", "", str(Path.cwd() / "relative" / "x"))
    assert join_uri("s3://b/a", "x", "y.json") == "s3://b/a/x/y.json"
    assert join_uri("s3://b/a/", "/x/") == "s3://b/a/x"
    assert join_uri("gs://b", "k") == "gs://b/k"
    assert join_uri(str(tmp_path), "bundles", "d.tar.gz") == f"{tmp_path}/bundles/d.tar.gz"


def test_each_scheme_has_one_storage_per_process(tmp_path: Path) -> None:
    assert storage_for(str(tmp_path)) is storage_for(f"file://{tmp_path}")
    assert storage_for("s3://a/b") is storage_for("s3://c")
    assert storage_for("gs://a/b").scheme == "gs"


def test_local_writes_leave_no_temporary_files_and_create_folders(tmp_path: Path) -> None:
    storage = storage_for(str(tmp_path))
    storage.write_bytes(str(tmp_path / "a" / "b" / "c.txt"), b"c")
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")] == ["a", "a/b", "a/b/c.txt"]


def test_local_listing_does_not_follow_symlinked_folders(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "big.bin").write_bytes(b"x")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "real.txt").write_bytes(b"r")
    (tmp_path / "root" / "linked").symlink_to(tmp_path / "elsewhere")
    assert [i.uri for i in storage_for(str(tmp_path)).list(str(tmp_path / "root"))] == [
        str(tmp_path / "root" / "real.txt")
    ]


# --- S3 at scale --------------------------------------------------------------------------------

def test_listing_thousands_of_s3_objects_pages_through_all_of_them_in_order(s3_bucket: str) -> None:
    root = f"s3://{s3_bucket}/many"
    storage = storage_for(root)
    names = [join_uri(root, f"part-{i:05d}", "x.json") for i in range(1100)]  # two pages of 1,000 keys
    with ThreadPoolExecutor(max_workers=10) as pool:  # botocore's connection pool holds 10
        list(pool.map(lambda uri: storage.write_bytes(uri, b"{}"), names))

    calls: list[str] = []

    def count(**_: object) -> None:
        calls.append("list")

    storage.client.meta.events.register("before-call.s3.ListObjectsV2", count)
    try:
        listing = storage.list(root)
        first = next(listing)
        assert len(calls) <= 2  # the exact-object probe and one page: nothing more fetched yet
        rest = [info.uri for info in listing]
    finally:
        storage.client.meta.events.unregister("before-call.s3.ListObjectsV2", count)
    assert [first.uri, *rest] == sorted(names)
    assert len(calls) >= 1 + 2  # the probe, then 1,100 keys in two pages of 1,000
