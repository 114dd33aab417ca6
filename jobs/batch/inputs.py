"""Job inputs read from storage: matching files, and splitting JSON-lines files into batches.

A `delimited_files` batch travels as a byte range of one file (`RangeRef`), not as its items:
the enqueuer streams each file once to validate every line and cut batches, and the worker
reads its own range straight from storage. The enqueuer's memory stays flat whatever the input
size, and the input never has to sit in Redis.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from wcmatch import glob

from foundation.errors import BadRequest, BadStorageUri, SluiceError
from jobs.batch.line_checks import HERE, BlockChecks, LineChecks
from predictors_runtime.storage import ObjectInfo, split_uri, storage_for
from predictors_runtime.storage.local import read_range_confined

if TYPE_CHECKING:  # a worker reads ranges without loading the submission's request schemas
    from jobs.batch.submission import FileSource

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
        # Spelled out: `dataclasses.asdict` deep-copies each field, a tenth of the cost of publishing a batch.
        return {"uri": self.uri, "start": self.start, "end": self.end, "lines": self.lines,
                "first_line": self.first_line}


READ_BLOCK = 1 << 20


def cut_ranges(files: list[ObjectInfo], batch_size: int, line_checks: LineChecks = HERE) -> Iterator[RangeRef]:
    """Stream each file once, validate every line as JSON, and yield one range per batch.

    A malformed line raises `EnqueueError` naming the file and the line number (from 1); lines
    holding only whitespace are skipped. With the enqueuer's `line_checks`, a large local file's
    lines are parsed by helper processes while the blocks before are cut (`jobs/batch/line_checks.py`).
    """
    for info in files:
        with storage_for(info.uri).open_read(info.uri) as stream, line_checks.lent(stream, info.size) as checks:
            yield from _RangeCutter(info.uri, batch_size).cut(stream, checks)


def _blocks_of_lines(stream: Any) -> Iterator[tuple[bytes, list[bytes], int]]:
    """The stream's lines (without newlines) a block at a time: the block, its lines, and the bytes they span."""
    pending: list[bytes] = []  # a line longer than a block, so far
    while block := stream.read(READ_BLOCK):
        cut = block.rfind(b"\n") + 1
        if cut == 0:
            pending.append(block)
            continue
        data = b"".join([*pending, block[: cut - 1]])
        pending = [block[cut:]] if cut < len(block) else []
        yield data, data.split(b"\n"), len(data) + 1
    tail = b"".join(pending)
    if tail:  # a last line without a newline
        yield tail, [tail], len(tail)


def _parsed_blocks(stream: Any, checks: BlockChecks) -> Iterator[tuple[list[bytes], int, bool]]:
    """Each block's lines, the bytes they span, and whether every one is a JSON value, the blocks
    parsed up to `checks.ahead` ahead of the one the caller cuts."""
    offset = 0
    sent: deque[tuple[list[bytes], int]] = deque()
    for data, lines, span in _blocks_of_lines(stream):
        checks.send(data, offset)
        sent.append((lines, span))
        offset += span
        while len(sent) > checks.ahead:
            yield *sent.popleft(), checks.answered()
    while sent:
        yield *sent.popleft(), checks.answered()


class _RangeCutter:
    """Cuts one file's lines into batches of `batch_size` items, validating each line.

    Every line is parsed with orjson, the parser the workers read the ranges with, so a line is
    accepted here exactly when a worker can read it. A block is first parsed in one C-level loop
    (`line_checks.all_json_values`: here, or in the helper process while the blocks before are
    cut); only a block holding a blank or a bad line is walked line by line, which skips blank
    lines and names the bad one. Parsing the block as one JSON array of its lines would
    not do: a line such as `1,2` adds an item that lines such as `[3` and `4]` take away again,
    so the item count can match while the lines are not JSON.
    """

    def __init__(self, uri: str, batch_size: int) -> None:
        self.uri, self.batch_size = uri, batch_size
        self.line = 0  # lines seen so far
        self.start = self.first_line = self.count = 0  # the batch being filled

    def cut(self, stream: Any, checks: BlockChecks) -> Iterator[RangeRef]:
        offset = 0
        for lines, span, all_values in _parsed_blocks(stream, checks):
            if all_values:
                yield from self._whole_block(lines, offset, offset + span)
            else:
                yield from self._line_by_line(lines, offset, offset + span)
            offset += span
        if self.count:
            yield self._emit(offset)

    def _emit(self, end: int) -> RangeRef:
        ref = RangeRef(self.uri, self.start, end, self.count, self.first_line)
        self.start, self.count = end, 0  # ranges are contiguous: blank lines go with the next batch
        return ref

    def _whole_block(self, lines: list[bytes], position: int, block_end: int) -> Iterator[RangeRef]:
        i = 0
        while i < len(lines):
            if self.count == 0:
                self.first_line = self.line + i + 1
            take = min(self.batch_size - self.count, len(lines) - i)
            position = min(position + sum(map(len, lines[i : i + take])) + take, block_end)
            self.count += take
            i += take
            if self.count == self.batch_size:
                yield self._emit(position)
        self.line += len(lines)

    def _line_by_line(self, lines: list[bytes], position: int, block_end: int) -> Iterator[RangeRef]:
        for line in lines:
            self.line += 1
            position = min(position + len(line) + 1, block_end)
            if not line.strip():
                continue
            try:
                orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise EnqueueError(f"{self.uri}: line {self.line}: not valid JSON: {e}") from e
            if self.count == 0:
                self.first_line = self.line
            self.count += 1
            if self.count == self.batch_size:
                yield self._emit(position)


def _items_of_lines(data: bytes) -> list[Any]:
    """The JSON values of `data`'s lines, blank lines skipped, in one parser call.

    The lines are first joined as they are (a range rarely holds a blank line); only where that
    does not parse are the blank lines taken out, one line at a time. A blank line (or one of
    whitespace only) cannot parse when joined, so both ways read the same lines."""
    try:
        items: list[Any] = orjson.loads(b"[" + data.rstrip(b"\r\n").replace(b"\n", b",") + b"]")
        return items
    except orjson.JSONDecodeError:
        lines = [line for line in data.split(b"\n") if line.strip()]
        items = orjson.loads(b"[" + b",".join(lines) + b"]")
        return items


def read_range(ref: dict[str, Any], local_roots: tuple[str, ...] | None = None) -> list[Any]:
    """The items of one JSON-lines batch, read by the worker that runs it.

    Every line was checked to be one JSON value when the job was enqueued, so the range parses
    as one JSON array of its lines (a single parser call). If the file changed since, the item
    count will not match, and the batch fails instead of running on other items. A local file
    is opened confined to `local_roots` (workers pass theirs; None: not checked), as it may have
    been swapped for a link since the submission was checked.
    """
    if local_roots is not None and is_local(ref["uri"]):
        data = read_range_confined(split_uri(ref["uri"])[2], ref["start"], ref["end"], local_roots)
    else:
        data = storage_for(ref["uri"]).read_range(ref["uri"], ref["start"], ref["end"])
    try:
        items = _items_of_lines(data)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{ref['uri']}: lines from {ref['first_line']}: not valid JSON any more: {e}") from e
    if len(items) != ref["lines"]:
        raise ValueError(
            f"{ref['uri']}: bytes {ref['start']}-{ref['end']} hold {len(items)} items, not the {ref['lines']} "
            "found when the job was enqueued: the file changed"
        )
    return items
