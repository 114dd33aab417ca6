"""The `sluice` command: Cortex's verbs (deploy, get, submit, wait, stop, predict, delete) for Sluice,
and the server roles a host runs (up, serve, replicas, workers, proxy).

Commands print tables or lines for people (rich) or, with `-o json`, one JSON document on stdout
for scripts (`logs -o json`: one per line). Every failure exits non-zero with one line on
stderr (`error: 404 api_not_found: ...`), never a traceback; `--url` / SLUICE_URL names a
remote Sluice.

- `base.py`: the group, its one-line failures and the output option;
- `render.py`: tables, times, progress and statuses in words;
- `verbs.py`: the client verbs; `roles.py`: the server roles; `environments.py`: `sluice env`.
"""

from __future__ import annotations

from . import roles, verbs  # noqa: F401  (each registers its commands on `main`)
from .base import main
from .environments import env_group
from .render import progress_line
from .roles import host_capacity

main.add_command(env_group)

__all__ = ["host_capacity", "main", "progress_line", "run"]


def run() -> None:
    """The console script's entry point."""
    main()
