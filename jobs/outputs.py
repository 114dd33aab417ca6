"""Job outputs: rows a predictor returns, written per batch, and the manifest written at job end."""

from __future__ import annotations

import io
import json
from typing import Any

from predictors_runtime.storage import join_uri, storage_for

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


def write_part(output: dict[str, Any], job_id: str, index: int, rows: list[Any]) -> int:
    """Write one batch's rows; a re-run of the batch overwrites its own part. Returns the row count."""
    uri = part_uri(output, job_id, index)
    storage_for(uri).write_bytes(uri, encode_rows(rows, output["format"]))
    return len(rows)


def write_manifest(
    output: dict[str, Any], job_id: str, total_batch_count: int, parts: dict[int, int], failed: list[dict[str, Any]]
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
    storage_for(uri).write_bytes(uri, json.dumps(manifest, indent=2).encode())
    return uri
