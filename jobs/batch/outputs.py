"""Job outputs: rows a predictor returns, written per batch, and the manifest written at job end."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from predictors_runtime.extras import needs_extra
from predictors_runtime.storage import join_uri, split_uri, storage_for
from predictors_runtime.storage.local import write_bytes_confined

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet", "csv": "csv"}
MANIFEST = "_manifest.json"


def part_uri(output: dict[str, Any], job_id: str, index: int) -> str:
    return join_uri(output["path"], job_id, f"part-{index:05d}.{EXTENSIONS[output['format']]}")


def _records(rows: list[Any]) -> list[dict[Any, Any]]:
    """Tabular formats need columns: dict rows give theirs, anything else becomes `value`."""
    return [row if isinstance(row, dict) else {"value": row} for row in rows]


def _columns(records: list[dict[Any, Any]]) -> dict[str, list[Any]]:
    """Column name -> its values, one per row (None where a row lacks the key).

    The columns are every key of every row, in the order they first appear: a key only later
    rows have is kept, not dropped for being absent from the first row.
    """
    keys = list(dict.fromkeys(key for record in records for key in record))
    return {str(key): [record.get(key) for record in records] for key in keys}


def _pyarrow(fmt: str) -> tuple[Any, Any]:
    """`(pyarrow, pyarrow.<parquet|csv>)`, imported on first use: only workers writing tabular
    outputs need pyarrow, and a missing one is named with the extra that brings it."""
    with needs_extra("server", f"writing {fmt} job outputs", package="pyarrow"):
        import pyarrow as pa
        import pyarrow.csv as pa_csv
        import pyarrow.parquet as pq
    return pa, pq if fmt == "parquet" else pa_csv


# Python types of the values a CSV column may keep as a typed (unquoted) column; any other
# mix becomes text, cell by cell.
_TYPED_CSV_COLUMNS = ({int}, {float}, {int, float}, {bool}, {str})


def _csv_cell(value: Any) -> str | None:
    """A value of a text column: strings as they are, None empty, anything else (a nested dict
    or list, a number among strings) as its JSON, as the jsonl format writes it."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def _csv_column(pa: Any, values: list[Any]) -> Any:
    """The Arrow array for one CSV column: numbers and booleans stay typed (written bare, so readers
    infer their types); nested values and mixed columns become text cells (written quoted)."""
    present = {type(value) for value in values if value is not None}
    if not present or present in _TYPED_CSV_COLUMNS:
        try:
            return pa.array(values)
        except (pa.ArrowException, OverflowError):  # an int beyond 64 bits
            pass
    return pa.array([_csv_cell(value) for value in values], pa.string())


def _csv_header(names: list[str]) -> bytes:
    """The header row, each name quoted only when it needs to be (a comma, a quote, a newline)."""
    line = io.StringIO()
    csv.writer(line, lineterminator="\n").writerow(names)
    return line.getvalue().encode()


def encode_rows(rows: list[Any], fmt: str) -> bytes:
    """One part's bytes in the output format.

    - `jsonl`: one JSON document per row.
    - `parquet`: one column per key of the dict rows, types inferred by Arrow.
    - `csv`: a header row of the column names, then one line per row; numbers and booleans
      (`true`/`false`) bare, strings quoted, a missing key or None empty, and a nested dict or
      list (or any value of a column that mixes types) as its JSON text in one quoted cell,
      quotes doubled: `"{""k"": [1, 2]}"`. Every CSV reader gets back the header and the cells.
    """
    if fmt == "jsonl":
        return "".join(json.dumps(row, default=str) + "\n" for row in rows).encode()
    if fmt == "parquet":
        pa, pq = _pyarrow(fmt)
        buffer = io.BytesIO()
        pq.write_table(pa.table(_columns(_records(rows))), buffer)
        return buffer.getvalue()
    if fmt == "csv":
        pa, pa_csv = _pyarrow(fmt)
        columns = _columns(_records(rows))
        header = _csv_header(list(columns))
        if not columns:
            return header
        table = pa.Table.from_arrays([_csv_column(pa, values) for values in columns.values()], names=list(columns))
        buffer = io.BytesIO()
        pa_csv.write_csv(table, buffer, pa_csv.WriteOptions(include_header=False))
        return header + buffer.getvalue()
    raise ValueError(f"unknown output format {fmt!r}")


def write_bytes(uri: str, data: bytes, local_roots: tuple[str, ...] | None = None) -> None:
    """Write an output object; a local one confined to `local_roots` (workers pass theirs; None: not checked),
    as a folder on its way may have been swapped for a link since the submission was checked."""
    scheme, _, path = split_uri(uri)
    if not scheme and local_roots is not None:
        write_bytes_confined(path, data, local_roots)
    else:
        storage_for(uri).write_bytes(uri, data)


def write_part(output: dict[str, Any], job_id: str, index: int, rows: list[Any],
               local_roots: tuple[str, ...] | None = None) -> int:
    """Write one batch's rows; a re-run of the batch overwrites its own part. Returns the row count."""
    write_bytes(part_uri(output, job_id, index), encode_rows(rows, output["format"]), local_roots)
    return len(rows)


def write_manifest(
    output: dict[str, Any], job_id: str, total_batch_count: int, parts: dict[int, int], failed: list[dict[str, Any]],
    local_roots: tuple[str, ...] | None = None,
) -> str:
    """`_manifest.json`: every part with its row count, and the failed batches."""
    manifest = {
        "job_id": job_id,
        "format": output["format"],
        "total_batch_count": total_batch_count,
        "rows": sum(parts.values()),
        "parts": [
            {"batch": index, "path": part_uri(output, job_id, index), "rows": parts[index]} for index in sorted(parts)
        ],
        "failed_batches": [{"batch": f["index"], "error": f["error"], "tries": f["tries"]} for f in failed],
    }
    uri = join_uri(output["path"], job_id, MANIFEST)
    write_bytes(uri, json.dumps(manifest, indent=2).encode(), local_roots)
    return uri
