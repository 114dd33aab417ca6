"""The `sluice` command."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from predictors_runtime.errors import SluiceError

from .client import Client


def _client(ctx: click.Context) -> Client:
    return Client(ctx.obj["url"])


def _print(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def progress_line(status: dict[str, Any]) -> str:
    metrics = status["batch_metrics"]
    done = metrics["succeeded"] + metrics["failed"]
    total = status["total_batch_count"] or 1
    width = 30
    filled = int(width * done / total)
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{status['total_batch_count']} batches "
        f"({metrics['failed']} failed) {status['status']}"
    )


@click.group()
@click.option("--url", envvar="SLUICE_URL", default=None, help="Sluice API URL (default http://127.0.0.1:8888).")
@click.pass_context
def main(ctx: click.Context, url: str | None) -> None:
    """Run Cortex-style batch projects on Celery and Redis."""
    ctx.obj = {"url": url}


@main.command()
@click.option("--port", default=8888, show_default=True)
@click.option("--workers", default=1, show_default=True, help="Worker nodes (one predictor process each).")
def up(port: int, workers: int) -> None:
    """Start Redis (private, unless SLUICE_REDIS_URL is set), workers, beat, the API, the proxy and a
    replica of each deployed realtime API; Ctrl-C stops all."""
    import os

    from .embedded import Stack

    stack = Stack(port=port, workers=workers, redis_url=os.environ.get("SLUICE_REDIS_URL") or None)
    click.echo("starting redis, the API, the proxy, beat and workers ...", err=True)
    try:
        stack.start()
    except SluiceError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"logs in {stack.data_dir / 'logs'}", err=True)
    click.echo(stack.url)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping:
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
def serve(api: str, port: int, host: str, advertise: str | None, api_url: str, state_dir: Path | None) -> None:
    """Run this host's replica of a RealtimeAPI (against SLUICE_REDIS_URL and SLUICE_STORAGE) until
    the API is deleted or SIGTERM; redeploys are rolled without a gap."""
    from predictors_runtime.log import configure_json_logging

    from .replica import serve as serve_replica

    configure_json_logging()
    sys.exit(serve_replica(api, port=port, host=host, advertise=advertise, api_url=api_url, state_dir=state_dir))


@main.command()
@click.option("--gpu", "hardware", flag_value="gpu", default=None, help="Only the APIs with compute.gpu > 0.")
@click.option("--cpu", "hardware", flag_value="cpu", help="Only the APIs without a GPU.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the replicas bind.")
@click.option("--advertise", default=None,
              help="Address the proxy reaches this host at (default: --host; this host's address for 0.0.0.0).")
@click.option("--api-url", envvar="SLUICE_API_URL", default="http://127.0.0.1:8888", show_default=True,
              help="Sluice's public URL, handed to the predictors as SLUICE_API_URL.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the replicas' state (default: $SLUICE_CACHE_DIR/replicas).")
def replicas(hardware: str | None, host: str, advertise: str | None, api_url: str, state_dir: Path | None) -> None:
    """Run a replica of every deployed RealtimeAPI (or only the GPU or the CPU ones) on this host, as
    `sluice up` does: one `sluice serve` per API on free ports, started on deploy, until SIGTERM."""
    from predictors_runtime.log import configure_json_logging

    from .replica_manager import serve_all

    configure_json_logging()
    sys.exit(serve_all(hardware=hardware, host=host, advertise=advertise, api_url=api_url, state_dir=state_dir))


@main.command()
@click.argument("config", default="cortex.yaml", type=click.Path(exists=True, path_type=Path))
@click.pass_context
def deploy(ctx: click.Context, config: Path) -> None:
    """Deploy the APIs of a cortex.yaml (its folder is the project)."""
    for api in _client(ctx).deploy(config):
        where = f"at /{api['name']}" if api["kind"] == "RealtimeAPI" else f"queue {api['queue']}"
        click.echo(f"deployed {api['name']} ({api['kind']}, {where}, bundle {api['bundle'][:12]})")
        for ignored in api["ignored_fields"]:
            click.echo(f"  note: {ignored} means nothing to Sluice and was ignored", err=True)


@main.command()
@click.argument("api")
@click.option("--items", "items_file", type=click.File("r"), help="JSON file holding a list of items.")
@click.option("--body", "body_file", type=click.File("r"),
              help="JSON file holding a whole job submission (file_path_lister, delimited_files, output, ...).")
@click.option("--batch-size", type=int, help="Items per batch, with --items.")
@click.option("--workers", default=1, show_default=True)
@click.option("--config", "config_json", default=None, help="Job config as JSON; merged over the API's.")
@click.option("--timeout", default=None, type=int, help="Seconds before the job is timed out.")
@click.option("--tries", default=None, type=int, help="Tries per batch (default 1).")
@click.option("--wait", is_flag=True, help="Wait for the job to end, showing progress.")
@click.pass_context
def submit(ctx: click.Context, api: str, items_file, body_file, batch_size: int | None, workers: int,
           config_json: str | None, timeout: int | None, tries: int | None, wait: bool) -> None:
    """Submit a job: inline items (--items, --batch-size) or a whole submission (--body)."""
    if (items_file is None) == (body_file is None):
        raise click.UsageError("give exactly one of --items or --body")
    if items_file is not None and batch_size is None:
        raise click.UsageError("--items needs --batch-size")
    try:
        config = json.loads(config_json) if config_json else None
        client = _client(ctx)
        if body_file is not None:
            body = json.load(body_file)
            body.setdefault("workers", workers)
            if config:
                body["config"] = config
            spec = client.submit_raw(api, body)
        else:
            spec = client.submit(api, json.load(items_file), batch_size, workers=workers, config=config,
                                 timeout=timeout, tries=tries)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not valid JSON: {e}") from e
    _print(spec)
    if wait:
        final = client.wait(api, spec["job_id"], on_progress=lambda s: click.echo("\r" + progress_line(s), nl=False, err=True))
        click.echo("", err=True)
        _print(final)
        if final["status"] != "status_succeeded":
            sys.exit(1)


@main.command()
@click.argument("api")
@click.argument("job_id")
@click.pass_context
def status(ctx: click.Context, api: str, job_id: str) -> None:
    """A job's status."""
    _print(_client(ctx).job(api, job_id))


@main.command()
@click.argument("api")
@click.pass_context
def jobs(ctx: click.Context, api: str) -> None:
    """An API's jobs, newest first."""
    for job in _client(ctx).jobs(api):
        click.echo(f"{job['job_id']}  {job['status']:<32} {job['batch_metrics']['succeeded']}/{job['total_batch_count']}")


@main.command()
@click.argument("api")
@click.argument("job_id")
@click.pass_context
def stop(ctx: click.Context, api: str, job_id: str) -> None:
    """Stop a job."""
    click.echo(_client(ctx).stop(api, job_id)["message"])


@main.command()
@click.pass_context
def apis(ctx: click.Context) -> None:
    """Deployed APIs."""
    for api in _client(ctx).apis():
        click.echo(f"{api['name']:<30} {api['kind']:<12} queue={api['queue']} bundle={api['bundle'][:12]}")


@main.command()
@click.argument("api")
@click.option("--force", is_flag=True, help="Stop the API's running jobs first.")
@click.pass_context
def delete(ctx: click.Context, api: str, force: bool) -> None:
    """Delete an API."""
    click.echo(_client(ctx).delete_api(api, force=force)["message"])


@main.command()
@click.option("--port", default=8888, show_default=True, help="The public port.")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address the public port listens on.")
@click.option("--management", required=True, help="host:port of the management API (gunicorn 'api:create_app()').")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for haproxy's configuration, log and master socket (default: $SLUICE_CACHE_DIR/proxy-PORT).")
def proxy(port: int, bind: str, management: str, state_dir: Path | None) -> None:
    """Run haproxy on the public port, its routes kept current from SLUICE_REDIS_URL, until SIGTERM or Ctrl-C."""
    import threading

    import redis

    from jobs.settings import Settings
    from predictors_runtime.log import configure_json_logging

    from .proxy import ProxyController

    configure_json_logging()
    settings = Settings.from_env()
    controller = ProxyController(
        redis.Redis.from_url(settings.redis_url), port=port, bind=bind, management=management,
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
        raise click.ClickException(f"cannot reach Redis at {settings.redis_url}: {e}") from e
    finally:
        controller.stop(grace=5.0)


def run() -> None:
    try:
        main(standalone_mode=True)
    except SluiceError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
