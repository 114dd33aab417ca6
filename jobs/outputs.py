"""Job outputs: rows a predictor returns, written per batch, and the manifest written at job end."""

from __future__ import annotations

import io
import json
from typing import Any

from predictors_runtime.storage import join_uri, split_uri, storage_for
from predictors_runtime.storage.local import write_bytes_confined

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet", "csv": "csv"}
MANIFEST = "_manifest.json"


def part_uri(output: dict[str, Any], job_id: str, index: int) -> str:
    return join_uri(output["path"], job_id, f"part-{index:05d}.{EXTENSIONS[output['format']]}")


def _records(rows: list[Any]) -> list[dict[str, Any]]:
    """Tabular formats need columns: dict rows give theirs, anything else becomes `value`."""
    return [row if isinstance(row, dict) else {"value": row} for row in rows]


def encode_rows(rows: list[Any], fmt: str) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps(row, default=str) + "\n" for row in rows).encode()
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(_records(rows)), buffer)
        return buffer.getvalue()
    if fmt == "csv":
        import pandas as pd

        return pd.DataFrame.from_records(_records(rows)).to_csv(index=False).encode()
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
