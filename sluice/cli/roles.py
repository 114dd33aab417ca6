"""The server roles a host runs: `sluice up` (everything on one host), `serve` (one replica),
`replicas` and `workers` (a host's room for replicas and worker nodes), `proxy` (the public
address)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from foundation.errors import SluiceError
from predictors_runtime.extras import needs_extra

from ..log_follow import LogFollower
from .base import main

if TYPE_CHECKING:
    from foundation.hosts import Resources


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
        click.option("--inf", "inf", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Inferentia Neuron cores this host offers (compute.inf; counted and handed out like GPUs)."),
    ]):
        command = option(command)
    return command


ONLY = "only"
SELF_SIGNED = "self-signed"


def host_capacity(cpu: str | None, mem: str | None, gpu: str | None, only: str | None,
                  inf: int = 0) -> tuple[Resources, str | None]:
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
            inf,
        )
    except BadQuantity as e:
        raise click.BadParameter(str(e)) from e
    return offers, hardware


def _whole_gpus(text: str) -> int:
    if not text.isdigit():
        raise click.BadParameter(f"--gpu must be a whole number of GPUs (got {text!r})")
    return int(text)


def tls_options(command: Callable[..., None]) -> Callable[..., None]:
    """`--tls-cert` and `--tls-key`: the public port serves TLS with this certificate chain and key."""
    readable = click.Path(exists=True, dir_okay=False, path_type=Path)
    for option in reversed([
        click.option("--tls-cert", envvar="SLUICE_TLS_CERT", type=readable, default=None,
                     help="PEM certificate chain for TLS on the public port (with --tls-key); a renewal on "
                          "disk is served without a restart."),
        click.option("--tls-key", envvar="SLUICE_TLS_KEY", type=readable, default=None,
                     help="PEM private key (unencrypted) of --tls-cert."),
    ]):
        command = option(command)
    return command


def _both_or_neither(cert: Path | None, key: Path | None) -> None:
    if (cert is None) != (key is None):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key (or SLUICE_TLS_CERT and SLUICE_TLS_KEY)")


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
@tls_options
@click.option("--tls", "tls_mode", type=click.Choice([SELF_SIGNED]), default=None,
              help="self-signed: make a CA and a certificate for this host in the data folder (kept across "
                   "restarts), serve TLS with them and print where the CA is, for trying TLS out.")
def up(port: int, workers: int, idle_grace: float, data_dir: Path | None, fresh: bool, verbose: bool,
       cpu: str | None, mem: str | None, gpu: str | None, only: str | None, inf: int, tls_cert: Path | None,
       tls_key: Path | None, tls_mode: str | None) -> None:
    """Start Redis (private, unless SLUICE_REDIS_URL or SLUICE_REDIS_SENTINELS is set), a worker host
    (`sluice workers`), beat, the API, the proxy and the replicas placed on this host; Ctrl-C stops all."""

    with needs_extra("server", "`sluice up`"):
        from ..embedded import Stack

    offers, hardware = host_capacity(cpu, mem, gpu, only, inf)
    _both_or_neither(tls_cert, tls_key)
    if tls_mode == SELF_SIGNED and tls_cert is not None:
        raise click.UsageError("--tls self-signed makes its own certificate: give it or --tls-cert/--tls-key, not both")
    home = (data_dir or Path(os.environ.get("SLUICE_HOME") or "~/.sluice")).expanduser()
    stack = Stack(port=port, workers=workers, redis_url=os.environ.get("SLUICE_REDIS_URL") or None,
                  offers=offers, hardware=hardware, worker_host=True, idle_grace_s=idle_grace, data_dir=home,
                  fresh=fresh, tls_cert=tls_cert, tls_key=tls_key, self_signed=tls_mode == SELF_SIGNED)
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
    if stack.self_signed:
        click.echo(f"TLS with a self-signed CA: clients trust it with SLUICE_CA_BUNDLE={stack.ca_bundle} "
                   f"(or --ca-bundle {stack.ca_bundle})", err=True)
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
        # The terminal may be gone (`sluice up | tee` ends with the Ctrl-C that stops the stack): a
        # write to it fails, and must not keep the stack from stopping.
        with contextlib.suppress(OSError):
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
        from ..replica import serve as serve_replica

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
@click.option("--pool", envvar="SLUICE_HOST_POOL", default=None,
              help="The host pool this host belongs to (one of SLUICE_HOST_POOLS, for scaling hosts).")
@click.option("--room", default="",
              help="A name this host shares with the other Sluice host of the same machine (its worker host, or "
                   "replica host): placement then counts the machine's room once for both.")
def replicas(cpu: str | None, mem: str | None, gpu: str | None, only: str | None, inf: int, host: str,
             advertise: str | None, host_id: str | None, api_url: str, state_dir: Path | None, pool: str | None,
             room: str) -> None:
    """Offer this host's room to realtime replicas and run those placed on it (several of one API
    when that is where the room is): one `sluice serve` per replica on free ports, until SIGTERM."""
    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice replicas`"):
        from ..replica_manager import serve_all

    offers, hardware = host_capacity(cpu, mem, gpu, only, inf)
    configure_json_logging()
    sys.exit(serve_all(hardware=hardware, host=host, advertise=advertise, api_url=api_url, state_dir=state_dir,
                       offers=offers, host_id=host_id, pool=pool, room=room))


@main.command()
@click.option("--queues", default="cpu", show_default=True, help="Hardware queues its nodes serve (comma-separated).")
@click.option("--cpu", default=None, help="CPU this host offers to nodes (2, 0.5, 500m; default: its cores).")
@click.option("--mem", default=None, help="Memory it offers (16Gi, 2G, bytes; default: the machine's).")
@click.option("--gpu", default=None, type=int, help="GPUs it offers (default: those nvidia-smi lists).")
@click.option("--inf", default=0, type=click.IntRange(min=0), show_default=True,
              help="Inferentia Neuron cores it offers (compute.inf).")
@click.option("--min-nodes", default=1, show_default=True, help="Nodes kept running however idle.")
@click.option("--idle-grace", default=60.0, show_default=True,
              help="Seconds a node above --min-nodes stays idle before it is stopped (warm shutdown).")
@click.option("--host-id", default=None, help="This host's name in placement (default: <hostname>-workers).")
@click.option("--pool", envvar="SLUICE_HOST_POOL", default=None,
              help="The host pool this host belongs to (one of SLUICE_HOST_POOLS, for scaling hosts).")
@click.option("--stop-grace", default=60.0, show_default=True,
              help="Seconds a stopping agent lets its nodes finish their batches before killing them.")
@click.option("--gpus-per-node", default=1, show_default=True,
              help="GPUs each node of a GPU host holds as its own (CUDA_VISIBLE_DEVICES).")
@click.option("--inf-per-node", default=1, show_default=True,
              help="Neuron cores each node of an Inferentia host holds as its own (NEURON_RT_VISIBLE_CORES).")
@click.option("--room", default="",
              help="A name this host shares with the other Sluice host of the same machine (its worker host, or "
                   "replica host): placement then counts the machine's room once for both.")
def workers(queues: str, cpu: str | None, mem: str | None, gpu: int | None, inf: int, min_nodes: int,
            idle_grace: float, host_id: str | None, pool: str | None, stop_grace: float, gpus_per_node: int,
            inf_per_node: int, room: str) -> None:
    """Run this host's worker nodes (against SLUICE_REDIS_URL) until SIGTERM or Ctrl-C: at least
    --min-nodes, and more while batch jobs want more `workers` and the host has room (each node takes
    its API's `compute`); idle ones above the minimum stop after --idle-grace."""
    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice workers`"):
        from foundation.hosts import BadQuantity, Resources, cpu_millis, machine_resources, mem_bytes

        from ..worker_host import AgentConfig, BadAgentOption, default_host_id, run_agent

    found = machine_resources()
    try:
        offers = Resources(cpu_millis(cpu) if cpu is not None else found.cpu_m,
                           mem_bytes(mem) if mem is not None else found.mem,
                           gpu if gpu is not None else found.gpu, inf)
        config = AgentConfig(host_id or default_host_id(), tuple(q.strip() for q in queues.split(",") if q.strip()),
                             offers, min_nodes=min_nodes, idle_grace_s=idle_grace, pool=pool, stop_grace_s=stop_grace,
                             gpus_per_node=gpus_per_node, inf_per_node=inf_per_node, room=room)
    except (BadQuantity, BadAgentOption) as e:
        raise click.BadParameter(str(e)) from e
    configure_json_logging()
    sys.exit(run_agent(config))


@main.command()
@click.option("--port", default=8888, show_default=True, help="The public port.")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address the public port listens on.")
@click.option("--management", required=True,
              help="host:port of the management API (gunicorn 'api:create_app()'); https://host:port when it "
                   "serves TLS (checked against SLUICE_HOST_TLS_CA, else the system's CAs).")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for haproxy's configuration, log and master socket (default: $SLUICE_CACHE_DIR/proxy-PORT).")
@tls_options
def proxy(port: int, bind: str, management: str, state_dir: Path | None, tls_cert: Path | None,
          tls_key: Path | None) -> None:
    """Run haproxy on the public port, its routes kept current from SLUICE_REDIS_URL, until SIGTERM or Ctrl-C."""
    import threading

    from foundation.json_logs import configure_json_logging

    with needs_extra("server", "`sluice proxy`"):
        import redis

        from foundation.redis_clients import heartbeat_client
        from foundation.settings import Settings

        from ..proxy import ProxyController
        from ..tls.hosts import backend_cas

    _both_or_neither(tls_cert, tls_key)
    configure_json_logging()
    settings = Settings.from_env()
    try:
        controller = ProxyController(
            heartbeat_client(settings), port=port, bind=bind, management=management,
            state_dir=state_dir or Path(settings.cache_dir) / f"proxy-{port}", tls_cert=tls_cert, tls_key=tls_key,
            backend_ca=backend_cas(os.environ),
        )
    except SluiceError as e:
        raise click.ClickException(str(e)) from e
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
    except SluiceError as e:
        raise click.ClickException(str(e)) from e
    finally:
        controller.stop(grace=5.0)
