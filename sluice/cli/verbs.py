"""The client verbs: deploy, get, submit, wait, stop, logs, predict, delete (and the first CLI's
hidden spellings), each a call to a Sluice through `sluice.client.Client`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import click

from foundation.api_kinds import ApiKind
from foundation.api_status import failure_of
from foundation.job_submissions import submission_body

from ..client import ACTIVE_STATUSES, TERMINAL_STATUSES, Client
from .base import Failure, client_of, main, one_line, output_option
from .render import (
    ago,
    duration_text,
    grpc_package_of,
    job_duration,
    print_json,
    print_table,
    progress_cell,
    realtime_status,
    replica_counts,
    split_line,
    status_word,
)


@main.command()
@click.argument("config", default="cortex.yaml", type=click.Path(exists=True, path_type=Path))
@click.option("--no-wait", is_flag=True, help="Return once deployed, without following environment builds.")
@click.option("--nearest-wheels", is_flag=True,
              help="For an old project: move an exact pin with no wheel for this Python to the oldest release "
                   "that has one, and a pin of a library Sluice runs on to Sluice's version (each move printed).")
@output_option
@click.pass_context
def deploy(ctx: click.Context, config: Path, no_wait: bool, nearest_wheels: bool, output: str) -> None:
    """Deploy the APIs of a cortex.yaml (its folder is the project); a project's requirements.txt and
    dependencies.sh are locked now and their environment's build on a host is followed."""
    from .environments import environment_line, follow_builds

    client = client_of(ctx)
    started = time.monotonic()
    deployed = client.deploy(config, nearest_wheels=nearest_wheels)
    if output == "json":
        print_json(deployed)
        return
    for api in deployed:
        if api["kind"] == ApiKind.TRAFFIC_SPLITTER:
            click.echo(f"deployed {api['name']} (TrafficSplitter, at /{api['name']}: {split_line(api['spec'])})")
            continue
        where = f"at /{api['name']}" if api["kind"] == ApiKind.REALTIME else f"queue {api['queue']}"
        if grpc_package_of(api):
            where = f"over gRPC, its methods at /{grpc_package_of(api)}.<Service>/<Method>"
        click.echo(f"deployed {api['name']} ({api['kind']}, {where}, bundle {api['bundle'][:12]})")
        if api.get("environment"):
            click.echo(f"  {environment_line(api['environment'])} (locked in {time.monotonic() - started:.1f} s)")
            for move in api["environment"].get("moved") or ():
                click.echo(f"  moved {move}")
        for ignored in api["ignored_fields"]:
            click.echo(f"  note: {ignored} means nothing to Sluice and was ignored", err=True)
        for warning in api.get("warnings") or ():
            click.echo(f"  warning: {api['name']} {warning}", err=True)
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
    client = client_of(ctx)

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
            ready, wanted = replica_counts(detail)
            row.update(status=realtime_status(detail), replicas_ready=ready, replicas_wanted=wanted)
        elif summary["kind"] == ApiKind.TRAFFIC_SPLITTER:  # what it shares, in the replicas column
            row.update(status="live", shares=split_line(summary["spec"]))
        elif summary["kind"] == ApiKind.ASYNC:  # requests queued or running, in the jobs column
            counts = client.api(summary["name"]).get("requests") or {}
            row.update(status="live", requests_active=counts.get("in_queue", 0) + counts.get("in_progress", 0))
        else:
            running = sum(1 for job in client.jobs(summary["name"]) if job["status"] in ACTIVE_STATUSES)
            row.update(status="live", jobs_running=running)
        if failure_of(summary) is not None:
            row["status"] = "error"  # a node could not build its predictor or environment: `sluice get API` says why
        rows.append(row)
    if output == "json":
        print_json(rows)
        return
    if not rows:
        click.echo("no apis are deployed")
        return
    print_table(None, ["name", "kind", "status", "replicas / jobs running", "last deployed"], [
        [r["name"], r["kind"], r["status"],
         f"{r['replicas_ready']}/{r['replicas_wanted']} ready" if "replicas_ready" in r
         else r["shares"] if "shares" in r
         else f"{r['requests_active']} requests" if "requests_active" in r
         else f"{r['jobs_running']} running",
         ago(r["deployed_at"], now)]
        for r in rows
    ])


def _get_api(client: Client, name: str, output: str) -> None:
    from .environments import environment_line

    now = time.time()
    api = client.api(name)
    if api["kind"] == ApiKind.REALTIME:
        _show_realtime(client, api, output, now)
        return
    if api["kind"] == ApiKind.TRAFFIC_SPLITTER:
        _show_splitter(api, output, now)
        return
    if api["kind"] == ApiKind.ASYNC:
        if output == "json":
            print_json(api)
            return
        click.echo(f"{name}  AsyncAPI  queue {api['queue']}  deployed {ago(api['deployed_at'], now)}")
        click.echo(f"endpoint: {api['endpoint']} (POST a request; GET {api['endpoint']}/<id> for its result)")
        click.echo(environment_line(api.get("environment")))
        if api.get("build_error"):
            click.echo(f"error: building the predictor failed {ago(api['build_error']['at'], now)}: "
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
        print_json({**api, "jobs": jobs})
        return
    click.echo(f"{name}  {api['kind']}  queue {api['queue']}  deployed {ago(api['deployed_at'], now)}")
    click.echo(f"endpoint: {api['endpoint']}")
    click.echo(environment_line(api.get("environment")))
    if api.get("build_error"):
        click.echo(f"error: building the predictor failed {ago(api['build_error']['at'], now)}: "
                   f"{one_line(api['build_error']['message'])}")
    if not jobs:
        click.echo("no jobs")
        return
    print_table("jobs", ["job id", "status", "succeeded/failed/total", "start", "duration"], [
        [job["job_id"], status_word(job["status"]), progress_cell(job), str(job.get("start_time", "-")),
         duration_text(job_duration(job, now))]
        for job in jobs
    ])


def _show_realtime(client: Client, api: dict[str, Any], output: str, now: float) -> None:
    """A RealtimeAPI: its endpoint, replicas, scaling and the models its replicas hold."""
    from ..client import ClientError
    from .environments import environment_line

    name = api["name"]
    ready, wanted = replica_counts(api)
    try:
        readiness: dict[str, Any] = client.readiness(name)
    except ClientError as e:
        readiness = {"ready": False, "kind": e.kind, "message": e.server_message}
    view = {**api, "url": f"{client.url}/{name}", "status": realtime_status(api),
            "replicas_ready": ready, "replicas_wanted": wanted, "readiness": readiness}
    if output == "json":
        print_json(view)
        return
    click.echo(f"{name}  RealtimeAPI  {view['status']}  deployed {ago(api['deployed_at'], now)}")
    click.echo(f"endpoint: {view['url']}")
    if grpc_package_of(api):
        host = client.url.split("://", 1)[-1].rstrip("/")
        click.echo(f"gRPC: {host}, methods at /{grpc_package_of(api)}.<Service>/<Method> (protobuf "
                   f"{api['spec']['predictor']['protobuf_path']})")
    click.echo(environment_line(api.get("environment")))
    click.echo(f"replicas: {ready}/{wanted} ready")
    _echo_realtime_scaling(api.get("scaling"))
    for replica in api.get("replicas", []):
        state = "draining" if replica["draining"] else "ready" if replica["ready"] else "starting"
        note = f"  {one_line(replica['message'])}" if replica.get("message") else ""
        gpus = f"  gpu {replica['devices']}" if replica.get("devices") else ""
        click.echo(f"  {replica['id']}  {replica['address']}  {state}{gpus}  bundle {replica['bundle'][:12]}{note}")
        if replica.get("last_oom_at"):
            click.echo(f"    out of memory {ago(replica['last_oom_at'], now)}: {replica['last_oom']}")
    models = readiness.get("models")
    if models:
        print_table("models", ["model", "versions"], [[str(m), _versions(v)] for m, v in _model_items(models)])
    elif not readiness.get("ready"):
        click.echo(f"not ready: {one_line(readiness.get('message') or '')}")


def _show_splitter(api: dict[str, Any], output: str, now: float) -> None:
    """A TrafficSplitter: its APIs, each with its weight, what it was sent, its share and its state."""
    if output == "json":
        print_json(api)
        return
    click.echo(f"{api['name']}  TrafficSplitter  deployed {ago(api['deployed_at'], now)}")
    click.echo(f"endpoint: {api['endpoint']}")
    print_table("apis", ["api", "weight", "sent", "share", "state"], [
        [part["api"] + (" (shadow)" if part["shadow"] else ""),
         f"{part['weight']}%" + (" copied" if part["shadow"] else ""), str(part["sent"]),
         "-" if part["share"] is None else f"{100 * part['share']:.1f}%", part["state"].replace("_", " ")]
        for part in api.get("split") or []
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
        print_json(answer) if output == "json" else _show_task_job(api, job, now)
        return
    failed = client.failed_batches(api, job_id)
    location = None
    if job.get("output"):
        from predictors_runtime.storage import join_uri

        location = join_uri(job["output"]["path"], job_id)
    if output == "json":
        # Cortex's `get API JOB_ID -o json` shape; Sluice's extras beside it.
        print_json({"job_status": job, "endpoint": answer["endpoint"], "api_spec": answer["api_spec"],
                "failed_batches": failed, "output_location": location})
        return
    metrics = job["batch_metrics"]
    workers = job["worker_counts"]
    average = metrics.get("average_time_per_batch")
    lines = [
        f"job {job_id} of {api}: {status_word(job['status'])}",
        f"start: {job.get('start_time', '-')}  end: {job.get('end_time') or '-'}  "
        f"duration: {duration_text(job_duration(job, now))}",
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
        print_table("failed batches", ["batch", "tries", "error"], [
            [str(b.get("index", b.get("batch_id", "?"))), str(b.get("tries", "-")), one_line(str(b.get("error", "")))]
            for b in failed
        ])


def _show_task_job(api: str, job: dict[str, Any], now: float) -> None:
    """A task job for people: status, times, config, worker counts and why it ended."""
    lines = [
        f"job {job['job_id']} of {api} (TaskAPI): {status_word(job['status'])}",
        f"start: {job.get('start_time', '-')}  end: {job.get('end_time') or '-'}  "
        f"duration: {duration_text(job_duration(job, now))}",
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
    client = client_of(ctx)
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
            print_json(spec)
        return
    final = _wait_with_progress(client, api, spec["job_id"], timeout=None)
    print_json(final) if output == "json" else click.echo(_final_line(final))
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

    console = Console(stderr=True, highlight=False, markup=False)
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
    final = _wait_with_progress(client_of(ctx), api, job_id, timeout)
    print_json(final) if output == "json" else click.echo(_final_line(final))
    _exit_for(final)


@main.command()
@click.argument("api")
@click.argument("job_id")
@output_option
@click.pass_context
def stop(ctx: click.Context, api: str, job_id: str, output: str) -> None:
    """Stop a running job (its queued batches are dropped)."""
    answer = client_of(ctx).stop(api, job_id)
    print_json(answer) if output == "json" else click.echo(answer["message"])


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
    client = client_of(ctx)

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
    client = client_of(ctx)
    kind = client.api(api)["kind"]
    # Any other kind's path would take the body as something else (a job, a queued request).
    if kind not in (ApiKind.REALTIME, ApiKind.TRAFFIC_SPLITTER):
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
        print_json(answer)
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
    client = client_of(ctx)
    answer = client.stop(api, job_id) if job_id is not None else client.delete_api(api, force=force)
    print_json(answer) if output == "json" else click.echo(answer["message"])


# -- the first CLI's commands, kept for scripts and docs that use them ---------------------
@main.command(hidden=True)
@click.argument("api")
@click.argument("job_id")
@output_option(default="json", help="Always the job_status as JSON; accepted for uniformity.")
@click.pass_context
def status(ctx: click.Context, api: str, job_id: str, output: str) -> None:
    """A job's status as JSON (`sluice get API JOB_ID -o json` shows more)."""
    print_json(client_of(ctx).job(api, job_id))


@main.command(hidden=True)
@click.argument("api")
@output_option
@click.pass_context
def jobs(ctx: click.Context, api: str, output: str) -> None:
    """An API's jobs, newest first (`sluice get API`)."""
    listed = client_of(ctx).jobs(api)
    if output == "json":
        print_json(listed)
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
    listed = client_of(ctx).apis()
    if output == "json":
        print_json(listed)
        return
    for api in listed:
        click.echo(f"{api['name']:<30} {api['kind']:<12} queue={api['queue']} bundle={api['bundle'][:12]}")


# -- running Sluice ------------------------------------------------------------------------
