"""The CLI's side of per-API environments: what `sluice deploy` and `sluice get` show of them, and
`sluice env ls` / `sluice env prune` for the environments on this host."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from predictors_runtime.extras import needs_extra

from ..client import Client

# How long `sluice deploy` waits for a host to start building a new environment before it says
# that none has (a deployment whose worker nodes are not kept by a worker host builds it at the
# first batch), and how long it follows a build at most.
FIRST_HOST_S = 20.0
BUILD_WAIT_S = 1800.0


def environment_line(environment: dict[str, Any] | None) -> str:
    """One line for `sluice get API`: the key, its state, the build time, the packages (or the error)."""
    if not environment:
        return "environment: sluice's own (the project installs nothing)"
    packages = environment.get("packages") or {}
    listed = ", ".join(f"{name}=={version}" for name, version in sorted(packages.items()))
    state = environment.get("state") or "locked"
    hosts = environment.get("hosts") or {}
    if state == "failed":
        return f"environment: {environment['key']} failed: {environment.get('error', '')}"
    seconds = [h["seconds"] for h in hosts.values() if h.get("state") == "ready" and h.get("seconds") is not None]
    built = f" (built in {max(seconds):.1f} s)" if seconds else ""
    where = f" on {len(hosts)} host{'s' if len(hosts) != 1 else ''}" if hosts else ""
    moved = "".join(f"; moved at deploy: {move}" for move in environment.get("moved") or ())
    return (f"environment: {environment['key']} {state}{where}{built}; "
            f"{len(packages)} package{'s' if len(packages) != 1 else ''}{': ' + listed if listed else ''}{moved}")


def follow_builds(client: Client, deployed: list[dict[str, Any]], first_host_s: float = FIRST_HOST_S,
                  timeout_s: float = BUILD_WAIT_S) -> dict[str, str]:
    """Show each new environment's build until a host has it ready or failed; API name -> its last state."""
    from rich.console import Console

    pending = {api["name"]: api["environment"]["key"] for api in deployed if api.get("environment")}
    outcome: dict[str, str] = {}
    if not pending:
        return outcome
    console = Console(stderr=True, highlight=False, markup=False)
    started = time.monotonic()
    with console.status("locking done; waiting for a host to build the environment") as status:
        while pending and time.monotonic() - started < timeout_s:
            for name, key in list(pending.items()):
                environment = client.api(name).get("environment") or {}
                state = environment.get("state") or "locked"
                elapsed = time.monotonic() - started
                if state in ("ready", "failed"):
                    outcome[name] = state
                    del pending[name]
                    if state == "ready":
                        hosts = environment.get("hosts") or {}
                        took = max((h.get("seconds") or 0.0) for h in hosts.values()) if hosts else 0.0
                        count = len(environment.get("packages") or {})
                        console.print(f"{name}: environment {key} built in {took:.1f} s "
                                      f"({count} package{'s' if count != 1 else ''})")
                    else:
                        console.print(f"{name}: environment {key} failed: {environment.get('error', '')}")
                elif state == "locked" and elapsed > first_host_s:
                    outcome[name] = state
                    del pending[name]
                    console.print(f"{name}: environment {key} is locked; no worker host has started building it: "
                                  "a worker node builds it before the first batch")
                else:
                    status.update(f"{name}: environment {key} {state} ({elapsed:.0f} s)")
            time.sleep(0.3)
    return outcome


@click.group("env")
def env_group() -> None:
    """The API environments on this host (under $SLUICE_CACHE_DIR/environments)."""


def _environments() -> Any:
    with needs_extra("server", "`sluice env`"):
        from foundation.settings import Settings
        from predictors_runtime.environments import HostEnvironments

    settings = Settings.from_env()
    return HostEnvironments.under(settings.cache_dir), settings


@env_group.command("ls")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def env_ls(output: str) -> None:
    """Every environment on this host: its key, whether it is finished, its size, when it was last used."""
    environments, _ = _environments()
    entries = environments.entries()
    if output == "json":
        click.echo(json.dumps([entry.__dict__ for entry in entries], indent=2))
        return
    if not entries:
        click.echo("no environments on this host")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("key", "state", "size", "packages", "last used", "in use"):
        table.add_column(column)
    now = time.time()
    for entry in entries:
        used = f"{(now - entry.last_used) / 60:.0f} min ago" if entry.last_used else "-"
        table.add_row(entry.key, "ready" if entry.complete else "incomplete", f"{entry.size_bytes / 2**20:.1f} MiB",
                      str(len(entry.packages)), used, "yes" if entry.in_use else "no")
    Console(highlight=False, markup=False).print(table)


@env_group.command("prune")
@click.option("--grace", type=float, default=None,
              help="Seconds unused before removal (default: SLUICE_ENVIRONMENT_GRACE_S; 0: now).")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def env_prune(grace: float | None, output: str) -> None:
    """Remove this host's environments that no deployed API and no active job uses, and prune uv's cache."""
    environments, settings = _environments()
    from foundation.api_registry import RedisApiRegistry
    from foundation.redis_clients import STORE
    from foundation.redis_clients import client as redis_client
    from jobs.store import JobStore

    from ..environment_upkeep import keys_in_use

    client = redis_client(settings.redis_address, STORE)
    keep = keys_in_use(RedisApiRegistry(client).all(), JobStore(client, settings.job_ttl_s))
    removed = environments.prune(keep, time.time(), settings.environment_grace_s if grace is None else grace)
    if output == "json":
        click.echo(json.dumps({"removed": removed}))
        return
    click.echo(f"removed {len(removed)} environment{'s' if len(removed) != 1 else ''}"
               + (f": {', '.join(removed)}" if removed else ""))
