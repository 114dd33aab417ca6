"""The `sluice` group itself: its options, how a failure is printed (one line, never a traceback),
the `-o table|json` option every printing command takes, and `sluice version`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar, overload

import click

from foundation.errors import SluiceError, summary_line
from foundation.version import sluice_version

from ..client import Client
from .render import print_json

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


# A message on one line: a predictor's traceback is cut down to the exception it ended with.
one_line = summary_line


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


def client_of(ctx: click.Context) -> Client:
    return Client(ctx.obj["url"], ca_bundle=ctx.obj.get("ca_bundle"))


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"sluice {sluice_version()}")
        ctx.exit()


@click.group(cls=SluiceGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print the version of this sluice command and exit.")
@click.option("--url", envvar="SLUICE_URL", default=None,
              help="Sluice's URL (default: $SLUICE_URL, else http://127.0.0.1:8888).")
@click.option("--ca-bundle", envvar="SLUICE_CA_BUNDLE", default=None, metavar="FILE",
              help="PEM CA certificates an https URL's certificate is checked against "
                   "(default: $SLUICE_CA_BUNDLE, else the system's).")
@click.pass_context
def main(ctx: click.Context, url: str | None, ca_bundle: str | None) -> None:
    """Run Cortex-style batch and realtime projects on Celery and Redis."""
    ctx.obj = {"url": url, "ca_bundle": ca_bundle}


@main.command()
@output_option
@click.pass_context
def version(ctx: click.Context, output: str) -> None:
    """The version of this sluice command."""
    mine = sluice_version()
    if output == "json":
        print_json({"client_version": mine})
    else:
        click.echo(f"sluice {mine}")
