"""The `sluice` command: Cortex's verbs (deploy, get, submit, wait, stop, predict, delete) for Sluice.

Commands print tables or lines for people (rich) or, with `-o json`, one JSON document on stdout
for scripts (`logs -o json`: one per line). Every failure exits non-zero with one line on
stderr (`error: 404 api_not_found: ...`), never a traceback; `--url` / SLUICE_URL names a
remote Sluice.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar, overload

import click

from foundation.api_kinds import ApiKind
from foundation.errors import SluiceError
from foundation.job_submissions import submission_body
from foundation.version import sluice_version
from predictors_runtime.extras import needs_extra

from .cli_environments import env_group
from .client import ACTIVE_STATUSES, TERMINAL_STATUSES, Client
from .log_follow import LogFollower

if TYPE_CHECKING:
    from rich.console import Console

    from foundation.hosts import Resources

OUTPUT_FORMATS = ("table", "json")


class SluiceGroup(click.Group):
    """A group whose failures are one line on stderr and a non-zero exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SluiceError as e:
            raise Failure(str(e)) from e
        except TimeoutError as e:
            raise Failure(f"timed out: {e}") from e

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            click.echo(f"error: {one_line(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


class Failure(click.ClickException):
    """A failure already worded for the user."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {one_line(self.format_message())}", err=True)


TRACEBACK = "Traceback (most recent call last):"


def one_line(message: str) -> str:
    """A message on one line: a predictor's traceback is cut down to the exception it ended with."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "failed"
    for index, line in enumerate(lines):
        if TRACEBACK in line:
            before = line.split(TRACEBACK, 1)[0]
            after = [rest for rest in lines[index + 1:] if not rest.startswith(("File ", "^", "~"))]
            return before + (after[-1] if after else "(traceback)")
    return lines[0] + (" (...)" if len(lines) > 1 else "")


_Command = TypeVar("_Command", bound=Callable[..., Any])
_OUTPUT_HELP = "table for people, json for scripts (one JSON document on stdout)."


@overload
def output_option(command: _Command) -> _Command: ...


@overload
def output_option(command: None = None, *, default: str = "table",
                  help: str = _OUTPUT_HELP) -> Callable[[_Command], _Command]: ...


def output_option(command: Callable[..., Any] | None = None, *, default: str = "table",
                  help: str = _OUTPUT_HELP) -> Any:
    """`-o/--output table|json`, on every command that prints, as Cortex's CLI had it."""
    option = click.option("-o", "--output", type=click.Choice(OUTPUT_FORMATS), default=default, show_default=True,
                          help=help)
    return option(command) if command is not None else option


def _client(ctx: click.Context) -> Client:
    return Client(ctx.obj["url"])


def _print(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def _console() -> Console:
    """A console for tables: the terminal's width, or unbounded when piped (no folded cells)."""
    from rich.console import Console

    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=1000)


def _table(title: str | None, columns: list[str], rows: list[list[str]]) -> None:
    from rich.table import Table

    table = Table(title=title, box=None, header_style="bold", title_justify="left", pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    _console().print(table)


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


def _ago(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "-"
    return f"{_duration(now - epoch)} ago"


def _duration(seconds: float | None) -> str:
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


def _job_duration(job: dict[str, Any], now: float) -> float | None:
    start = _epoch(job.get("start_time"))
    if start is None:
        return None
    end = _epoch(job.get("end_time")) or now
    return end - start


def status_word(status: str) -> str:
    """A job status as every human-readable line spells it: `succeeded` for `status_succeeded`
    (JSON output keeps Cortex's spelling)."""
    return status.removeprefix("status_")


def _progress(job: dict[str, Any]) -> str:
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
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{status['total_batch_count']} batches "
        f"({metrics['failed']} failed) {status_word(status['status'])}"
    )


def _replica_counts(api: dict[str, Any]) -> tuple[int, int]:
    """(ready, wanted): every live, non-draining replica is wanted (one per serving host)."""
    live = [r for r in api.get("replicas", []) if not r.get("draining")]
    return sum(1 for r in live if r.get("ready")), len(live)


def _realtime_status(api: dict[str, Any]) -> str:
    ready, wanted = _replica_counts(api)
    if any(r.get("message") for r in api.get("replicas", [])):
        return "error" if not ready else "live (with errors)"
    if wanted == 0:
        return "no replicas"
    if any(r.get("bundle") != api["bundle"] for r in api.get("replicas", [])):
        return "updating"
    return "live" if ready else "starting"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"sluice {sluice_version()}")
        ctx.exit()


@click.group(cls=SluiceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version of this sluice command and exit.")
@click.option("--url", envvar="SLUICE_URL", default=None,
              help="Sluice's URL (default: $SLUICE_URL, else http://127.0.0.1:8888).")
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """Run Cortex-style batch and realtime projects on Celery and Redis."""
    ctx.obj = {"url": url}


@main.command()
@output_option
@click.pass_context
def version(ctx: click.Context, output: str) -> None:
    """The version of this sluice command."""
    mine = sluice_version()
    if output == "json":
        _print({"client_version": mine})
    else:
        click.echo(f"sluice {mine}")


@main.command()
@click.argument("config", default="cortex.yaml", type=click.Path(exists=True, path_type=Path))
@click.option("--no-wait", is_flag=True, help="Return once deployed, without following environment builds.")
@output_option
@click.pass_context
def deploy(ctx: click.Context, config: Path, no_wait: bool, output: str) -> None:
    """Deploy the APIs of a cortex.yaml (its folder is the project); a project's requirements.txt and
    dependencies.sh are locked now and their environment's build on a host is followed."""
    from .cli_environments import environment_line, follow_builds

    client = _client(ctx)
    started = time.monotonic()
    deployed = client.deploy(config)
    if output == "json":
        _print(deployed)
        return
    for api in deployed:
        where = f"at /{api['name']}" if api["kind"] == ApiKind.REALTIME else f"queue {api['queue']}"
        click.echo(f"deployed {api['name']} ({api['kind']}, {where}, bundle {api['bundle'][:12]})")
        if api.get("environment"):
            click.echo(f"  {environment_line(api['environment'])} (locked in {time.monotonic() - started:.1f} s)")
        for ignored in api["ignored_fields"]:
            click.echo(f"  note: {ignored} means nothing to Sluice and was ignored", err=True)
    if not no_wait and any(api.get("environment") for api in deployed):
        failed = [name for name, state in follow_builds(client, deployed).items() if state == "failed"]
        if failed:
            raise Failure(f"the environment of {', '.join(failed)} could not be built (sluice get API says why)")


@main.command()
@click.argument("api", required=False)
@click.argument("job_id", required=False)
@click.option("--watch", "-w", is_flag=True, help="Show it again every --interval seconds until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between two looks with --watch.")
@output_option
@click.pass_context
def get(ctx: click.Context, api: str | None, job_id: str | None, watch: bool, interval: float, output: str) -> None:
    """Every API; one API (realtime: replicas and models; batch: its jobs); or one job of a batch API.

    \b
    sluice get                  # name, kind, status, replicas or running jobs, last deployed
    sluice get API              # realtime: endpoint, replicas, models; batch: jobs and progress;
                                # async: requests queued, in progress, ended per minute; nodes
    sluice get API JOB_ID       # batch metrics, workers, failed batches, output location
    sluice get -w [API]         # again every 2 s, redrawn in place, until Ctrl-C
    """
    client = _client(ctx)

    def show() -> None:
        if api is None:
            _get_all(client, output)
        elif job_id is None:
            _get_api(client, api, output)
        else:
            _get_job(client, api, job_id, output)

    if not watch:
        show()
        return
    if output == "json":
        raise click.UsageError("--watch redraws for a person to read; scripts poll `sluice get -o json` themselves")
    _watch(show, interval)


def _watch(show: Callable[[], None], interval: float) -> None:
    """`show()` every `interval` seconds: on a terminal redrawn in place, elsewhere one after
    another under a time line. Ctrl-C ends it (exit 0); an error ends it as any command's does."""
    import contextlib
    import io

    terminal = sys.stdout.isatty()
    try:
        while True:
            drawn = io.StringIO()
            with contextlib.redirect_stdout(drawn):
                show()
            if terminal:
                click.clear()
            heading = f"every {interval:g}s: {datetime.now().strftime('%H:%M:%S')} (Ctrl-C stops)"
            click.echo(f"{heading}\n\n{drawn.getvalue()}", nl=not terminal)
            time.sleep(interval)
    except KeyboardInterrupt:
        pass


def _get_all(client: Client, output: str) -> None:
    now = time.time()
    rows = []
    for summary in client.apis():
        row: dict[str, Any] = {"name": summary["name"], "kind": summary["kind"], "deployed_at": summary["deployed_at"]}
        if summary["kind"] == ApiKind.REALTIME:
            detail = client.api(summary["name"])
            ready, wanted = _replica_counts(detail)
            row.update(status=_realtime_status(detail), replicas_ready=ready, replicas_wanted=wanted)
        elif summary["kind"] == ApiKind.ASYNC:  # requests queued or running, in the jobs column
            counts = client.api(summary["name"]).get("requests") or {}
            row.update(status="live", requests_active=counts.get("in_queue", 0) + counts.get("in_progress", 0))
        else:
            running = sum(1 for job in client.jobs(summary["name"]) if job["status"] in ACTIVE_STATUSES)
            row.update(status="live", jobs_running=running)
        if summary.get("build_error") or (summary.get("environment") or {}).get("state") == "failed":
            row["status"] = "error"  # a node could not build its predictor or environment: `sluice get API` says why
        rows.append(row)
    if output == "json":
        _print(rows)
        return
    if not rows:
        click.echo("no apis are deployed")
        return
    _table(None, ["name", "kind", "status", "replicas / jobs running", "last deployed"], [
        [r["name"], r["kind"], r["status"],
         f"{r['replicas_ready']}/{r['replicas_wanted']} ready" if "replicas_ready" in r
         else f"{r['requests_active']} requests" if "requests_active" in r
         else f"{r['jobs_running']} running",
         _ago(r["deployed_at"], now)]
        for r in rows
    ])


def _get_api(client: Client, name: str, output: str) -> None:
    from .cli_environments import environment_line
    from .client import ClientError

    now = time.time()
    api = client.api(name)
    if api["kind"] == ApiKind.REALTIME:
        ready, wanted = _replica_counts(api)
        try:
            readiness: dict[str, Any] = client.readiness(name)
        except ClientError as e:
            readiness = {"ready": False, "kind": e.kind, "message": e.server_message}
        view = {**api, "url": f"{client.url}/{name}", "status": _realtime_status(api),
                "replicas_ready": ready, "replicas_wanted": wanted, "readiness": readiness}
        if output == "json":
            _print(view)
            return
        click.echo(f"{name}  RealtimeAPI  {view['status']}  deployed {_ago(api['deployed_at'], now)}")
        click.echo(f"endpoint: {view['url']}")
        click.echo(environment_line(api.get("environment")))
        click.echo(f"replicas: {ready}/{wanted} ready")
        _echo_realtime_scaling(api.get("scaling"))
        for replica in api.get("replicas", []):
            state = "draining" if replica["draining"] else "ready" if replica["ready"] else "starting"
            note = f"  {one_line(replica['message'])}" if replica.get("message") else ""
            click.echo(f"  {replica['id']}  {replica['address']}  {state}  bundle {replica['bundle'][:12]}{note}")
        models = readiness.get("models")
        if models:
            _table("models", ["model", "versions"], [[str(m), _versions(v)] for m, v in _model_items(models)])
        elif not readiness.get("ready"):
            click.echo(f"not ready: {one_line(readiness.get('message') or '')}")
        return
    if api["kind"] == ApiKind.ASYNC:
        if output == "json":
            _print(api)
            return
        click.echo(f"{name}  AsyncAPI  queue {api['queue']}  deployed {_ago(api['deployed_at'], now)}")
        click.echo(f"endpoint: {api['endpoint']} (POST a request; GET {api['endpoint']}/<id> for its result)")
        click.echo(environment_line(api.get("environment")))
        if api.get("build_error"):
            click.echo(f"error: building the predictor failed {_ago(api['build_error']['at'], now)}: "
                       f"{one_line(api['build_error']['message'])}")
        counts = api.get("requests") or {}
        click.echo(f"requests: {counts.get('in_queue', 0)} in queue, {counts.get('in_progress', 0)} in progress, "
                   f"{counts.get('completed_per_minute', 0)} completed and {counts.get('failed_per_minute', 0)} "
                   "failed in the last minute")
        nodes = api.get("nodes") or []
        click.echo(f"nodes: {', '.join(nodes) if nodes else 'none placed on it (queue ' + api['queue'] + ')'}")
        scaling = api.get("scaling")
        if scaling is not None:
            click.echo(f"scaling: {scaling['desired']} wanted, {scaling['ready']} ready, {scaling['pending']} "
                       f"pending; {scaling['in_flight']:g} request(s) in flight at the last decision")
        return
    jobs = client.jobs(name)
    if output == "json":
        _print({**api, "jobs": jobs})
        return
    click.echo(f"{name}  {api['kind']}  queue {api['queue']}  deployed {_ago(api['deployed_at'], now)}")
    click.echo(f"endpoint: {api['endpoint']}")
    click.echo(environment_line(api.get("environment")))
    if api.get("build_error"):
        click.echo(f"error: building the predictor failed {_ago(api['build_error']['at'], now)}: "
                   f"{one_line(api['build_error']['message'])}")
    if not jobs:
        click.echo("no jobs")
        return
    _table("jobs", ["job id", "status", "succeeded/failed/total", "start", "duration"], [
        [job["job_id"], status_word(job["status"]), _progress(job), str(job.get("start_time", "-")),
         _duration(_job_duration(job, now))]
        for job in jobs
    ])


def _echo_realtime_scaling(scaling: dict[str, Any] | None) -> None:
    """What the scaler wants and saw, where placement put the replicas, and why any are pending."""
    if scaling is None:
        return
    click.echo(f"scaling: {scaling['desired']} wanted, {scaling['ready']} ready, {scaling.get('starting', 0)} "
               f"starting, {scaling['pending']} pending; {scaling['in_flight']:g} request(s) in flight at the "
               "scaler's last decision")
    for host, counts in sorted((scaling.get("hosts") or {}).items()):
        click.echo(f"  host {host}: {counts['desired']} wanted, {counts['ready']} ready")
    if scaling["pending"]:
        click.echo(f"pending: {one_line(scaling.get('pending_reason') or 'no host has room')}")


def _model_items(models: Any) -> list[tuple[str, Any]]:
    """The models of a readiness answer, whether a mapping of name -> info or a list of entries."""
    if isinstance(models, dict):
        return list(models.items())
    if isinstance(models, list):
        return [(m.get("name", "?"), m) if isinstance(m, dict) else (str(m), None) for m in models]
    return [(str(models), None)]


def _versions(info: Any) -> str:
    if isinstance(info, dict):
        versions = info.get("versions")
        if versions is not None:
            return ", ".join(str(v) for v in versions) or "-"
        return ", ".join(f"{k}={v}" for k, v in info.items() if k != "name") or "-"
    if isinstance(info, list):
        return ", ".join(str(v) for v in info) or "-"
    return "-" if info is None else str(info)


def _get_job(client: Client, api: str, job_id: str, output: str) -> None:
    now = time.time()
    answer = client.get_job(api, job_id)
    job = answer["job_status"]
    if job.get("kind") == ApiKind.TASK:
        _print(answer) if output == "json" else _show_task_job(api, job, now)
        return
    failed = client.failed_batches(api, job_id)
    location = None
    if job.get("output"):
        from predictors_runtime.storage import join_uri

        location = join_uri(job["output"]["path"], job_id)
    if output == "json":
        # Cortex's `get API JOB_ID -o json` shape; Sluice's extras beside it.
        _print({"job_status": job, "endpoint": answer["endpoint"], "api_spec": answer["api_spec"],
                "failed_batches": failed, "output_location": location})
        return
    metrics = job["batch_metrics"]
    workers = job["worker_counts"]
    average = metrics.get("average_time_per_batch")
    lines = [
        f"job {job_id} of {api}: {status_word(job['status'])}",
        f"start: {job.get('start_time', '-')}  end: {job.get('end_time') or '-'}  "
        f"duration: {_duration(_job_duration(job, now))}",
        f"batches: {metrics['succeeded']} succeeded, {metrics['failed']} failed, {job['total_batch_count']} total, "
        f"{job.get('batches_in_queue', 0)} in queue; average {average if average is not None else '-'} s per batch",
        f"workers: {job['workers']} requested; " + ", ".join(f"{k} {v}" for k, v in workers.items())
        + (f" ({job['workers_note']})" if job.get("workers_note") else ""),
        f"output: {location or 'none (the predictor writes its own results)'}",
    ]
    if job.get("message"):
        lines.append(f"message: {job['message']}")
    click.echo("\n".join(lines))
    if failed:
        _table("failed batches", ["batch", "tries", "error"], [
            [str(b.get("index", b.get("batch_id", "?"))), str(b.get("tries", "-")), one_line(str(b.get("error", "")))]
            for b in failed
        ])


def _show_task_job(api: str, job: dict[str, Any], now: float) -> None:
    """A task job for people: status, times, config, worker counts and why it ended."""
    lines = [
        f"job {job['job_id']} of {api} (TaskAPI): {status_word(job['status'])}",
        f"start: {job.get('start_time', '-')}  end: {job.get('end_time') or '-'}  "
        f"duration: {_duration(_job_duration(job, now))}",
        f"timeout: {job['timeout'] if job.get('timeout') is not None else 'none'}  config: {json.dumps(job['config'])}",
        "workers: " + ", ".join(f"{k} {v}" for k, v in job["worker_counts"].items()),
    ]
    if job.get("message"):
        lines.append(f"message: {job['message']}")
    click.echo("\n".join(lines))


@main.command()
@click.argument("api")
@click.argument("submission", required=False, type=click.File("r"))
@click.option("--items", "items_file", type=click.File("r"), help="JSON file holding a list of items.")
@click.option("--body", "body_file", type=click.File("r"),
              help="Same as the SUBMISSION argument: a JSON file holding a whole job submission.")
@click.option("--batch-size", type=int, help="Items per batch, with --items.")
@click.option("--workers", default=None, type=int, help="Workers (default 1; overrides the submission's).")
@click.option("--config", "config_json", default=None, help="Job config as JSON; merged over the API's.")
@click.option("--timeout", default=None, type=int, help="Seconds before the job is timed out.")
@click.option("--tries", default=None, type=int, help="Tries per batch (default 1).")
@click.option("--wait", is_flag=True, help="Wait for the job to end, showing progress; non-zero unless it succeeds.")
@output_option(default="json", help="json (one document: the job's spec, or with --wait its final job_status) "
               "or table (a line for people).")
@click.pass_context
def submit(ctx: click.Context, api: str, submission: IO[str] | None, items_file: IO[str] | None,
           body_file: IO[str] | None, batch_size: int | None,
           workers: int | None, config_json: str | None, timeout: int | None, tries: int | None, wait: bool,
           output: str) -> None:
    """Submit a job to a BatchAPI (or run a TaskAPI's task) and print its spec (JSON), or with --wait
    its final job_status.

    \b
    sluice submit API job.json                       # any submission body (item_list, file_path_lister, ...)
    sluice submit API --items items.json --batch-size 10 [--workers 2] [--config '{...}']
    sluice submit TASK_API [--config '{...}'] [--timeout 600]   # a TaskAPI: its Task runs once
    """
    if submission is not None and body_file is not None:
        raise click.UsageError("give the submission file once (SUBMISSION or --body)")
    body_file = body_file or submission
    if items_file is not None and body_file is not None:
        raise click.UsageError("give a SUBMISSION file (or --body), or --items with --batch-size")
    if items_file is not None and batch_size is None:
        raise click.UsageError("--items needs --batch-size")
    client = _client(ctx)
    if items_file is None and body_file is None and client.api(api)["kind"] != ApiKind.TASK:
        raise click.UsageError("give a SUBMISSION file (or --body), or --items with --batch-size")
    try:
        config = json.loads(config_json) if config_json else None
        if items_file is None and body_file is None:
            spec = client.submit_task(api, config=config, timeout=timeout)
        elif body_file is not None:
            body = json.load(body_file)
            if not isinstance(body, dict):
                raise click.BadParameter("a job submission is a JSON object")
            spec = client.submit_raw(api, submission_body(body, workers=workers, config=config, timeout=timeout,
                                                          tries=tries))
        else:
            assert batch_size is not None and items_file is not None  # refused above when missing with --items
            spec = client.submit(api, json.load(items_file), batch_size, workers=workers or 1, config=config,
                                 timeout=timeout, tries=tries)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not valid JSON: {e}") from e
    if output == "table":
        size = "its task" if spec["kind"] == ApiKind.TASK else f"{spec['total_batch_count']} batches"
        click.echo(f"submitted job {spec['job_id']} to {api}: {size}, {spec['workers']} worker(s)")
    if not wait:
        if output == "json":
            _print(spec)
        return
    final = _wait_with_progress(client, api, spec["job_id"], timeout=None)
    _print(final) if output == "json" else click.echo(_final_line(final))
    _exit_for(final)


def _wait_with_progress(client: Client, api: str, job_id: str, timeout: float | None) -> dict[str, Any]:
    """Poll the job with a live progress bar on stderr (batches done/total, rate, ETA); its final status."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:.2f} batches/s" if speed else "- batches/s")

    console = Console(stderr=True, highlight=False)
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("batches"), RateColumn(),
        TextColumn("eta"), TimeRemainingColumn(), TimeElapsedColumn(),
        # Only on a terminal: piped stderr keeps to the one-line reason scripts read.
        console=console, transient=False, disable=not console.is_terminal,
    )
    with progress:
        task = progress.add_task(job_id, total=None)

        def show(status: dict[str, Any]) -> None:
            # Until a first batch ends, the job's phase says what is happening (enqueuing, waiting
            # for nodes, building the predictor on one); then the counts do.
            doing = status.get("phase") or status_word(status["status"])
            metrics = status.get("batch_metrics")
            if metrics is None:  # a task job: no batches to count
                progress.update(task, description=f"{job_id} {doing}")
                return
            failed = f", {metrics['failed']} failed" if metrics["failed"] else ""
            progress.update(task, completed=metrics["succeeded"] + metrics["failed"],
                            total=status["total_batch_count"] or None, description=f"{job_id} {doing}{failed}")

        return client.wait(api, job_id, timeout=timeout, on_progress=show)


def _final_line(final: dict[str, Any]) -> str:
    metrics = final.get("batch_metrics")
    if metrics is None:  # a task job
        return f"job {final['job_id']}: {status_word(final['status'])}"
    return (f"job {final['job_id']}: {status_word(final['status'])} ({metrics['succeeded']} succeeded, "
            f"{metrics['failed']} failed of {final['total_batch_count']} batches)")


def _exit_for(final: dict[str, Any]) -> None:
    if final["status"] != "status_succeeded":
        message = f": {one_line(final['message'])}" if final.get("message") else ""
        raise Failure(f"job {final['job_id']} ended {status_word(final['status'])}{message}")


@main.command()
@click.argument("api")
@click.argument("job_id")
@click.option("--timeout", type=float, default=None, help="Give up (non-zero) after this many seconds.")
@output_option
@click.pass_context
def wait(ctx: click.Context, api: str, job_id: str, timeout: float | None, output: str) -> None:
    """Follow a job with a live progress bar until it ends; exit 0 only if it succeeded."""
    final = _wait_with_progress(_client(ctx), api, job_id, timeout)
    _print(final) if output == "json" else click.echo(_final_line(final))
    _exit_for(final)


@main.command()
@click.argument("api")
@click.argument("job_id")
@output_option
@click.pass_context
def stop(ctx: click.Context, api: str, job_id: str, output: str) -> None:
    """Stop a running job (its queued batches are dropped)."""
    answer = _client(ctx).stop(api, job_id)
    _print(answer) if output == "json" else click.echo(answer["message"])


# A followed job's lines are read for this long after it ended: its last batch's and its
# completion's lines are shipped by their workers just after the job's status changed.
FOLLOW_SETTLE_S = 2.0
FOLLOW_POLL_S = 0.5
LOG_PAGE_LINES = 1000
_LOG_KEYS = ("asctime", "levelname", "message", "labels", "process", "exception")


def log_text(line: dict[str, Any]) -> str:
    """A log line for people: time, level, where it ran (batch, request, process), message, other fields."""
    labels = line.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    where = [f"{key}={value}" for key, value in labels.items() if key not in ("job_id", "api")]
    if line.get("process") is not None:
        where.append(f"pid={line['process']}")
    parts = [str(line.get("asctime", "-")), f"{line.get('levelname', '-'):<7}", *where, str(line.get("message", ""))]
    extra = {key: value for key, value in line.items() if key not in _LOG_KEYS}
    if extra:
        parts.append(json.dumps(extra, default=str, separators=(",", ":")))
    text = " ".join(parts)
    if line.get("exception"):
        text += "\n" + str(line["exception"])
    return text


LogFetch = Callable[[str | None, int], dict[str, Any]]


def _print_logs(fetch: LogFetch, after: str | None, show: Callable[[dict[str, Any]], None]) -> str | None:
    """Print every line past `after`, a page at a time; the position to go on from."""
    while True:
        page = fetch(after, LOG_PAGE_LINES)
        for line in page["lines"]:
            show(line)
        if page["lines"]:
            after = page["next"]
        if len(page["lines"]) < LOG_PAGE_LINES:
            return after


def _follow_logs(fetch: LogFetch, ended: Callable[[], bool], after: str | None,
                 show: Callable[[dict[str, Any]], None]) -> None:
    """Print new lines as they come: until the job or request has ended (and settled), or forever for an API."""
    ended_at: float | None = None
    while True:
        time.sleep(FOLLOW_POLL_S)
        done = ended()
        after = _print_logs(fetch, after, show)
        if done:
            ended_at = ended_at if ended_at is not None else time.monotonic()
            if time.monotonic() - ended_at >= FOLLOW_SETTLE_S:
                return


def _log_source(client: Client, api: str, job_id: str | None) -> tuple[LogFetch, Callable[[], bool]]:
    """Where `sluice logs` reads pages from, and how a follow knows it is over: an AsyncAPI request's
    stream (until it has ended), a job's (until it has ended), or a realtime or async API's (never over)."""
    if job_id is not None and client.api(api)["kind"] == ApiKind.ASYNC:
        request_id = job_id

        def request_page(after: str | None, limit: int) -> dict[str, Any]:
            return client.get_async_logs(api, request_id, after=after, limit=limit)

        def request_ended() -> bool:
            return client.get_async(api, request_id)["status"] in ("completed", "failed")

        return request_page, request_ended

    def page(after: str | None, limit: int) -> dict[str, Any]:
        return client.get_logs(api, job_id, after=after, limit=limit)

    def job_ended() -> bool:
        return job_id is not None and client.job(api, job_id)["status"] in TERMINAL_STATUSES

    return page, job_ended


@main.command()
@click.argument("api")
@click.argument("job_id", required=False)
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing new lines: until the job or request ends, or for a whole API until Ctrl-C.")
@output_option
@click.pass_context
def logs(ctx: click.Context, api: str, job_id: str | None, follow: bool, output: str) -> None:
    """A job's or an AsyncAPI request's log lines from every host, or a RealtimeAPI's or AsyncAPI's recent lines.

    \b
    sluice logs API JOB_ID              # the job's lines so far: its batches and on_job_complete
    sluice logs API JOB_ID --follow     # ... and new ones as they come, until the job ends
    sluice logs API REQUEST_ID          # an AsyncAPI request's lines (--follow: until it ends)
    sluice logs API [--follow]          # a RealtimeAPI's or AsyncAPI's recent lines (--follow: until Ctrl-C)
    sluice logs API JOB_ID -o json      # each line as the JSON object it was logged as, one per line
    """
    client = _client(ctx)

    def show(line: dict[str, Any]) -> None:
        click.echo(json.dumps(line, default=str) if output == "json" else log_text(line))

    fetch, ended = _log_source(client, api, job_id)
    try:
        after = _print_logs(fetch, None, show)
        if follow:
            _follow_logs(fetch, ended, after, show)
    except KeyboardInterrupt:  # how a follow of a realtime API ends
        return


@main.command()
@click.argument("api")
@click.option("--json", "json_file", type=click.File("rb"), help="File holding the JSON request body ('-': stdin).")
@click.option("--data", "data", default=None,
              help="The request body; sent as JSON when it parses as JSON, else as text.")
@output_option(help="table: the answer as it came (JSON pretty-printed); json: the answer as one JSON document "
               "(a text answer as a JSON string).")
@click.pass_context
def predict(ctx: click.Context, api: str, json_file: IO[bytes] | None, data: str | None, output: str) -> None:
    """Send one request to a RealtimeAPI and print its answer."""
    if (json_file is None) == (data is None):
        raise click.UsageError("give exactly one of --json FILE or --data TEXT")
    if json_file is not None:
        body = json_file.read()
        try:
            json.loads(body)
        except ValueError as e:
            raise click.BadParameter(f"--json: not valid JSON: {e}") from e
        content_type = "application/json"
    else:
        data = data or ""  # given: exactly one of the two is
        body = data.encode()
        try:
            json.loads(data)
            content_type = "application/json"
        except ValueError:
            content_type = "text/plain"
    client = _client(ctx)
    kind = client.api(api)["kind"]
    if kind != ApiKind.REALTIME:  # its path would take the body as something else (a job, a queued request)
        verb = {ApiKind.BATCH: f"submit a job: sluice submit {api} --items FILE",
                ApiKind.TASK: f"run its task: sluice submit {api} (or POST /tasks/{api})",
                ApiKind.ASYNC: f"queue a request: sluice.client().submit_async({api!r}, payload), then "
                            f"GET /{api}/<id> for its result"}.get(kind, "see sluice get " + api)
        raise Failure(f"api {api} is a {kind}, not a RealtimeAPI: {verb}")
    answer = client.predict_raw(api, body, content_type)
    if output == "json" and isinstance(answer, bytes):
        try:
            answer = answer.decode()
        except UnicodeDecodeError as e:
            raise Failure(f"the answer is {len(answer)} bytes of binary data, not JSON or text; "
                          "leave out -o json to write it to stdout as it is") from e
    if output == "json" or isinstance(answer, (dict, list, int, float, bool)) or answer is None:
        _print(answer)
    elif isinstance(answer, bytes):
        sys.stdout.buffer.write(answer)
    else:
        click.echo(answer)


@main.command()
@click.argument("api")
@click.argument("job_id", required=False)
@click.option("--force", is_flag=True, help="Stop the API's running jobs first (not with JOB_ID).")
@output_option
@click.pass_context
def delete(ctx: click.Context, api: str, job_id: str | None, force: bool, output: str) -> None:
    """Delete an API (refused while it has running jobs, unless --force); with JOB_ID, stop that job
    instead, as `cortex delete API JOB_ID` did (same as `sluice stop API JOB_ID`).

    \b
    sluice delete API [--force]     # delete the API
    sluice delete API JOB_ID        # stop one of its jobs; the API stays
    """
    if job_id is not None and force:
        raise click.UsageError("--force is for deleting an API; `delete API JOB_ID` stops only that job")
    client = _client(ctx)
    answer = client.stop(api, job_id) if job_id is not None else client.delete_api(api, force=force)
    _print(answer) if output == "json" else click.echo(answer["message"])


# -- the first CLI's commands, kept for scripts and docs that use them ---------------------
@main.command(hidden=True)
@click.argument("api")
@click.argument("job_id")
@output_option(default="json", help="Always the job_status as JSON; accepted for uniformity.")
@click.pass_context
def status(ctx: click.Context, api: str, job_id: str, output: str) -> None:
    """A job's status as JSON (`sluice get API JOB_ID -o json` shows more)."""
    _print(_client(ctx).job(api, job_id))


@main.command(hidden=True)
@click.argument("api")
@output_option
@click.pass_context
def jobs(ctx: click.Context, api: str, output: str) -> None:
    """An API's jobs, newest first (`sluice get API`)."""
    listed = _client(ctx).jobs(api)
    if output == "json":
        _print(listed)
        return
    for job in listed:
        metrics = job.get("batch_metrics")  # none for a task job
        done = f"{metrics['succeeded']}/{job['total_batch_count']}" if metrics is not None else "-"
        click.echo(f"{job['job_id']}  {status_word(job['status']):<24} {done}")


@main.command(hidden=True)
@output_option
@click.pass_context
def apis(ctx: click.Context, output: str) -> None:
    """Deployed APIs (`sluice get`)."""
    listed = _client(ctx).apis()
    if output == "json":
        _print(listed)
        return
    for api in listed:
        click.echo(f"{api['name']:<30} {api['kind']:<12} queue={api['queue']} bundle={api['bundle'][:12]}")


# -- running Sluice ------------------------------------------------------------------------
def capacity_options(command: Callable[..., None]) -> Callable[..., None]:
    """`--cpu`, `--mem`, `--gpu`: the room a host offers to placement (default: what the machine has).

    Given without a value, `--gpu` and `--cpu` keep their earlier meaning: the host takes only the
    APIs with a GPU (or only those without), as `--only gpu|cpu` says.
    """
    for option in reversed([
        click.option("--cpu", "cpu", is_flag=False, flag_value=ONLY, default=None, metavar="[QUANTITY]",
                     help="CPU this host offers (2, 0.5, 1500m; default: its cores); alone: --only cpu."),
        click.option("--mem", "mem", default=None, metavar="QUANTITY",
                     help="Memory this host offers (16Gi, 2G; default: the machine's)."),
        click.option("--gpu", "gpu", is_flag=False, flag_value=ONLY, default=None, metavar="[COUNT]",
                     help="GPUs this host offers (default: those nvidia-smi lists); alone: --only gpu."),
        click.option("--only", "only", type=click.Choice(["cpu", "gpu"]), default=None,
                     help="Take only the realtime APIs without a GPU (cpu) or with one (gpu)."),
    ]):
        command = option(command)
    return command


ONLY = "only"


def host_capacity(cpu: str | None, mem: str | None, gpu: str | None, only: str | None) -> tuple[Resources, str | None]:
    """The room a host offers and the hardware it is limited to, from the capacity options."""
    with needs_extra("server", "a host's --cpu, --mem and --gpu"):
        from foundation.hosts import BadQuantity, Resources, cpu_millis, machine_resources, mem_bytes

    hardware = only or ("gpu" if gpu == ONLY else "cpu" if cpu == ONLY else None)
    if gpu == ONLY and cpu == ONLY:
        raise click.UsageError("--gpu and --cpu without a value each limit the host to one kind of API: give one")
    found = machine_resources()
    try:
        offers = Resources(
            found.cpu_m if cpu in (None, ONLY) else cpu_millis(cpu),
            found.mem if mem is None else mem_bytes(mem),
            found.gpu if gpu in (None, ONLY) else _whole_gpus(gpu),
        )
    except BadQuantity as e:
        raise click.BadParameter(str(e)) from e
    return offers, hardware


def _whole_gpus(text: str) -> int:
    if not text.isdigit():
        raise click.BadParameter(f"--gpu must be a whole number of GPUs (got {text!r})")
    return int(text)


@main.command()
@click.option("--port", default=8888, show_default=True)
@click.option("--workers", default=1, show_default=True,
              help="Worker nodes kept running however idle (one predictor process each); more are started "
                   "while jobs ask more `workers` and the room allows.")
@click.option("--idle-grace", default=60.0, show_default=True,
              help="Seconds a worker node above --workers stays idle before it is stopped.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the stack keeps its state (Redis, bundles, job outputs, logs) across restarts "
                   "(default: $SLUICE_HOME, else ~/.sluice).")
@click.option("--fresh", is_flag=True, help="Start with empty state: what the data folder held is removed first.")
@click.option("--verbose", "-v", is_flag=True,
              help="Show every process's log lines here as they are written (they are in the logs folder anyway).")
@capacity_options
def up(port: int, workers: int, idle_grace: float, data_dir: Path | None, fresh: bool, verbose: bool,
       cpu: str | None, mem: str | None, gpu: str | None, only: str | None) -> None:
    """Start Redis (private, unless SLUICE_REDIS_URL or SLUICE_REDIS_SENTINELS is set), a worker host
    (`sluice workers`), beat, the API, the proxy and the replicas placed on this host; Ctrl-C stops all."""
    import os

    with needs_extra("server", "`sluice up`"):
        from .embedded import Stack

    offers, hardware = host_capacity(cpu, mem, gpu, only)
    home = (data_dir or Path(os.environ.get("SLUICE_HOME") or "~/.sluice")).expanduser()
    stack = Stack(port=port, workers=workers, redis_url=os.environ.get("SLUICE_REDIS_URL") or None,
                  offers=offers, hardware=hardware, worker_host=True, idle_grace_s=idle_grace, data_dir=home,
                  fresh=fresh)
    click.echo(f"starting redis, the API, the proxy, beat and a worker host in {home} ...", err=True)
    follower = LogFollower(home / "logs") if verbose else None
    try:
        stack.start()
    except SluiceError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"state in {home} (APIs, jobs and their outputs are kept across restarts; --fresh starts empty)",
               err=True)
    click.echo(f"logs in {home / 'logs'}" + ("" if verbose else " (--verbose shows them here)"), err=True)
    address = stack.redis_address
    flower = "" if address.sentinels else f"; to watch tasks in Flower: celery --broker {address} flower"
    click.echo(f"redis at {address}{flower} (task events need SLUICE_TASK_EVENTS=1)", err=True)
    click.echo(f"docs at {stack.url}/docs", err=True)
    click.echo(stack.url)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping:
            for name, line in follower.new_lines() if follower is not None else ():
                click.echo(f"{click.style(name, fg='cyan')} | {line}", err=True)
            # Worker nodes that die are restarted by the stack; anything else ends the stack.
            dead = [c.name for c in stack.children if not c.is_worker and c.process.poll() is not None]
            if dead:
                click.echo(f"{', '.join(dead)} exited; stopping\n{stack.logs()}", err=True)
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping ...", err=True)
        stack.stop()


@main.command()
@click.argument("api")
@click.option("--port", default=8080, show_default=True,
              help="The replica's port; a redeploy starts the new replica on port+1 (then port again).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the replica binds.")
@click.option("--advertise", default=None,
              help="Address the proxy reaches this host at (default: --host; this host's address for 0.0.0.0).")
@click.option("--api-url", envvar="SLUICE_API_URL", default="http://127.0.0.1:8888", show_default=True,
              help="Sluice's public URL, handed to the predictor as SLUICE_API_URL.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the replicas' state (default: $SLUICE_CACHE_DIR/replicas).")
@click.option("--placement-host", default="", hidden=True,
              help="The placement host id whose agent started this launcher (set by `sluice replicas`).")
def serve(api: str, port: int, host: str, advertise: str | None, api_url: str, state_dir: Path | None,
          placement_host: str) -> None:
    """Run this host's replica of a RealtimeAPI (against SLUICE_REDIS_URL and SLUICE_STORAGE) until
    the API is deleted or SIGTERM; redeploys are rolled without a gap."""
    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice serve`"):
        from .replica import serve as serve_replica

    configure_json_logging()
    sys.exit(serve_replica(api, port=port, host=host, advertise=advertise, api_url=api_url, state_dir=state_dir,
                           placement_host=placement_host))


@main.command()
@capacity_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the replicas bind.")
@click.option("--advertise", default=None,
              help="Address the proxy reaches this host at (default: --host; this host's address for 0.0.0.0).")
@click.option("--host-id", default=None,
              help="This host's name in placement (default: <hostname>/<advertised address>/<hardware>).")
@click.option("--api-url", envvar="SLUICE_API_URL", default="http://127.0.0.1:8888", show_default=True,
              help="Sluice's public URL, handed to the predictors as SLUICE_API_URL.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the replicas' state (default: $SLUICE_CACHE_DIR/replicas).")
def replicas(cpu: str | None, mem: str | None, gpu: str | None, only: str | None, host: str, advertise: str | None,
             host_id: str | None, api_url: str, state_dir: Path | None) -> None:
    """Offer this host's room to realtime replicas and run those placed on it (several of one API
    when that is where the room is): one `sluice serve` per replica on free ports, until SIGTERM."""
    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice replicas`"):
        from .replica_manager import serve_all

    offers, hardware = host_capacity(cpu, mem, gpu, only)
    configure_json_logging()
    sys.exit(serve_all(hardware=hardware, host=host, advertise=advertise, api_url=api_url, state_dir=state_dir,
                       offers=offers, host_id=host_id))


@main.command()
@click.option("--queues", default="cpu", show_default=True, help="Hardware queues its nodes serve (comma-separated).")
@click.option("--cpu", default=None, help="CPU this host offers to nodes (2, 0.5, 500m; default: its cores).")
@click.option("--mem", default=None, help="Memory it offers (16Gi, 2G, bytes; default: the machine's).")
@click.option("--gpu", default=None, type=int, help="GPUs it offers (default: those nvidia-smi lists).")
@click.option("--min-nodes", default=1, show_default=True, help="Nodes kept running however idle.")
@click.option("--idle-grace", default=60.0, show_default=True,
              help="Seconds a node above --min-nodes stays idle before it is stopped (warm shutdown).")
@click.option("--host-id", default=None, help="This host's name in placement (default: <hostname>-workers).")
def workers(queues: str, cpu: str | None, mem: str | None, gpu: int | None, min_nodes: int, idle_grace: float,
            host_id: str | None) -> None:
    """Run this host's worker nodes (against SLUICE_REDIS_URL) until SIGTERM or Ctrl-C: at least
    --min-nodes, and more while batch jobs want more `workers` and the host has room (each node takes
    its API's `compute`); idle ones above the minimum stop after --idle-grace."""
    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice workers`"):
        from foundation.hosts import BadQuantity, Resources, cpu_millis, machine_resources, mem_bytes

        from .worker_host import AgentConfig, BadAgentOption, default_host_id, run_agent

    found = machine_resources()
    try:
        offers = Resources(cpu_millis(cpu) if cpu is not None else found.cpu_m,
                           mem_bytes(mem) if mem is not None else found.mem,
                           gpu if gpu is not None else found.gpu)
        config = AgentConfig(host_id or default_host_id(), tuple(q.strip() for q in queues.split(",") if q.strip()),
                             offers, min_nodes=min_nodes, idle_grace_s=idle_grace)
    except (BadQuantity, BadAgentOption) as e:
        raise click.BadParameter(str(e)) from e
    configure_json_logging()
    sys.exit(run_agent(config))


@main.command()
@click.option("--port", default=8888, show_default=True, help="The public port.")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address the public port listens on.")
@click.option("--management", required=True, help="host:port of the management API (gunicorn 'api:create_app()').")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for haproxy's configuration, log and master socket (default: $SLUICE_CACHE_DIR/proxy-PORT).")
def proxy(port: int, bind: str, management: str, state_dir: Path | None) -> None:
    """Run haproxy on the public port, its routes kept current from SLUICE_REDIS_URL, until SIGTERM or Ctrl-C."""
    import threading

    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice proxy`"):
        import redis

        from foundation.redis_clients import heartbeat_client
        from foundation.settings import Settings

        from .proxy import ProxyController

    configure_json_logging()
    settings = Settings.from_env()
    controller = ProxyController(
        heartbeat_client(settings), port=port, bind=bind, management=management,
        state_dir=state_dir or Path(settings.cache_dir) / f"proxy-{port}",
    )
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        controller.start()
        click.echo(f"proxy on {controller.url} (haproxy state in {controller.state_dir})", err=True)
        controller.run(stopping)
    except KeyboardInterrupt:
        pass
    except redis.RedisError as e:
        raise click.ClickException(f"cannot reach Redis at {settings.redis_address}: {e}") from e
    finally:
        controller.stop(grace=5.0)


main.add_command(env_group)


def run() -> None:
    """The console script's entry point."""
    main()


if __name__ == "__main__":
    run()
