"""How the CLI shows things to people: tables, times, a job's progress and status in words, a
realtime API's state."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from foundation import api_status as status

if TYPE_CHECKING:
    from rich.console import Console


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def table_console() -> Console:
    """A console for tables: the terminal's width, or unbounded when piped (no folded cells)."""
    from rich.console import Console

    console = Console(highlight=False, markup=False)
    return console if console.is_terminal else Console(highlight=False, markup=False, width=1000)


def print_table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    from rich.table import Table

    table = Table(title=title, box=None, header_style="bold", title_justify="left", pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    table_console().print(table)


def _epoch(value: Any) -> float | None:
    """An epoch from a float or an RFC 3339 string (job specs carry the latter)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def ago(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "-"
    return f"{duration_text(now - epoch)} ago"


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def job_duration(job: dict[str, Any], now: float) -> float | None:
    start = _epoch(job.get("start_time"))
    if start is None:
        return None
    end = _epoch(job.get("end_time")) or now
    return end - start


# The statuses whose short word needs its meaning beside it.
_MEANINGS = {"worker_oom": "worker_oom: out of memory"}


def status_word(status: str) -> str:
    """A job status as every human-readable line spells it: `succeeded` for `status_succeeded`,
    `worker_oom: out of memory` (JSON output keeps Cortex's spelling)."""
    word = status.removeprefix("status_")
    return _MEANINGS.get(word, word)


def progress_cell(job: dict[str, Any]) -> str:
    metrics = job.get("batch_metrics")
    if metrics is None:  # a task job: one run, no batches
        return "-"
    return f"{metrics['succeeded']}/{metrics['failed']}/{job['total_batch_count']}"


def progress_line(status: dict[str, Any]) -> str:
    """A one-line text progress bar (used where no live display is wanted, e.g. examples/demo.py)."""
    metrics = status["batch_metrics"]
    done = metrics["succeeded"] + metrics["failed"]
    total = status["total_batch_count"] or 1
    width = 30
    filled = int(width * done / total)
    # Until its first batch ends, a running job says what it is doing (building the predictor,
    # waiting for nodes), not merely `running`.
    doing = status.get("phase") or status_word(status["status"])
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{status['total_batch_count']} batches "
        f"({metrics['failed']} failed) {doing}"
    )


def replica_counts(api: dict[str, Any]) -> tuple[int, int]:
    """(ready, wanted) of a realtime API (`GET /apis/<name>`)."""
    return status.replica_counts(api.get("replicas", []))


def realtime_status(api: dict[str, Any]) -> str:
    """A realtime API's status (`GET /apis/<name>`), as the front page shows it too."""
    return status.realtime_status(api["bundle"], api.get("replicas", []))


def split_line(spec: dict[str, Any]) -> str:
    """A TrafficSplitter's shares in one line: `30% iris-onnx, 70% iris-tf; copies 100% to recorder`."""
    shared = [f"{a['weight']}% {a['name']}" for a in spec.get("apis", []) if not a.get("shadow")]
    shadow = [f"; copies {a['weight']}% to {a['name']}" for a in spec.get("apis", []) if a.get("shadow")]
    return ", ".join(shared) + "".join(shadow)


def grpc_package_of(api: dict[str, Any]) -> str:
    """The package of a gRPC API's service (its name with - spelled _, as on Cortex); "" for any other."""
    predictor = (api.get("spec") or {}).get("predictor") or {}
    return str(api["name"]).replace("-", "_") if predictor.get("protobuf_path") else ""
