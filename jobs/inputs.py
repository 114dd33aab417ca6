"""Job inputs read from storage: matching files, and splitting JSON-lines files into batches.

A `delimited_files` batch travels as a byte range of one file (`RangeRef`), not as its items:
the enqueuer streams each file once to validate every line and cut batches, and the worker
reads its own range straight from storage. The enqueuer's memory stays flat whatever the input
size, and the input never has to sit in Redis.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import orjson
from wcmatch import glob

from predictors_runtime.errors import BadRequest, BadStorageUri, SluiceError
from predictors_runtime.storage import ObjectInfo, split_uri, storage_for

from .submission import FileSource

_GLOB_FLAGS = glob.GLOBSTAR | glob.DOTGLOB


class EnqueueError(SluiceError):
    """Job input turned out to be unusable while it was being read (e.g. a malformed line)."""

    http_status = 400
    kind = "enqueue_failed"


def check_local_path(path: str, roots: tuple[str, ...]) -> str:
    """The real absolute path of a local input or output, refused unless it lies under an allowed root.

    Symlinks and `..` are resolved first, so neither can lead out of a root.
    """
    if not roots:
        raise BadStorageUri(
            f"{path}: local paths are not allowed; the operator can allow folders with SLUICE_LOCAL_INPUT_ROOTS"
        )
    if path.startswith("file://"):
        path = path[len("file://"):]
    if not os.path.isabs(path):
        raise BadStorageUri(f"{path}: local paths must be absolute")
    real = os.path.realpath(path)
    for root in roots:
        real_root = os.path.realpath(root)
        if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
            return real
    raise BadStorageUri(f"{path}: outside the allowed local roots ({os.pathsep.join(roots)})")


def is_local(uri: str) -> bool:
    return split_uri(uri)[0] == ""


def matches(uri: str, includes: list[str], excludes: list[str]) -> bool:
    """Keep a file if it matches any include (when there are includes), then drop it if it matches any exclude."""
    if includes and not any(glob.globmatch(uri, pattern, flags=_GLOB_FLAGS) for pattern in includes):
        return False
    return not any(glob.globmatch(uri, pattern, flags=_GLOB_FLAGS) for pattern in excludes)


def match_files(source: FileSource, local_roots: tuple[str, ...], field: str) -> list[ObjectInfo]:
    """Every file under `source.s3_paths` kept by the globs, sorted, each once. None -> 400."""
    found: dict[str, ObjectInfo] = {}
    for index, path in enumerate(source.s3_paths):
        if is_local(path):
            path = check_local_path(path, local_roots)
        try:
            listed = list(storage_for(path).list(path))
        except BadStorageUri as e:
            raise BadStorageUri(f"{field}.s3_paths[{index}]: {e.message}") from e
        for info in listed:
            if is_local(info.uri):
                check_local_path(info.uri, local_roots)  # a symlink inside a root may point out of it
            if matches(info.uri, source.includes, source.excludes):
                found.setdefault(info.uri, info)
    if not found:
        raise BadRequest(
            f"{field}: no files matched s3_paths {source.s3_paths}"
            + (f" with includes {source.includes}" if source.includes else "")
            + (f" and excludes {source.excludes}" if source.excludes else "")
        )
    return [found[uri] for uri in sorted(found)]


@dataclass(frozen=True)
class RangeRef:
    """A batch of a JSON-lines file: bytes [start, end) holding `lines` items."""

    uri: str
    start: int
    end: int
    lines: int
    first_line: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cut_ranges(files: list[ObjectInfo], batch_size: int) -> Iterator[RangeRef]:
    """Stream each file once, validate every line as JSON, and yield one range per batch.

    A malformed line raises `EnqueueError` naming the file and the line number (from 1).
    """
    for info in files:
        storage = storage_for(info.uri)
        offset = start = first_line = 0
        count = 0
        with storage.open_read(info.uri) as stream:
            for number, line in enumerate(stream, start=1):
                if count == 0:
                    start, first_line = offset, number
                offset += len(line)
                if not line.strip():
                    continue
                try:
                    orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise EnqueueError(f"{info.uri}: line {number}: not valid JSON: {e}") from e
                count += 1
                if count == batch_size:
                    yield RangeRef(info.uri, start, offset, count, first_line)
                    count = 0
        if count:
            yield RangeRef(info.uri, start, offset, count, first_line)


def read_range(ref: dict[str, Any]) -> list[Any]:
    """The items of one JSON-lines batch, read by the worker that runs it."""
    data = storage_for(ref["uri"]).read_range(ref["uri"], ref["start"], ref["end"])
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]
