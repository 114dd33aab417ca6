"""An API's status in one word, as `sluice get` and the front page show it.

Read from what `GET /apis` and `GET /apis/<name>` answer (plain mappings), so that the command line
and the page say the same of the same API: `error` only for a failure (a predictor or environment
that failed to build, a replica whose server keeps exiting), never for an API that is starting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from foundation.api_kinds import ApiKind


def replica_counts(replicas: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(ready, wanted): every live, non-draining replica is wanted (one per serving host)."""
    live = [r for r in replicas if not r.get("draining")]
    return sum(1 for r in live if r.get("ready")), len(live)


def realtime_status(bundle: str, replicas: Sequence[Mapping[str, Any]]) -> str:
    """`live`, `starting`, `updating` (a redeploy rolling), `no replicas`, `error` or `live (with errors)`."""
    ready, wanted = replica_counts(replicas)
    # A replica building its environment or starting says so in its message: only a failure is an error.
    if any(r.get("failing") for r in replicas):
        return "error" if not ready else "live (with errors)"
    if wanted == 0:
        return "no replicas"
    if any(r.get("bundle") != bundle for r in replicas):
        return "updating"
    return "live" if ready else "starting"


def failure_of(view: Mapping[str, Any]) -> str | None:
    """What failed for an API (`GET /apis`'s entry): its predictor's last build on a node, or its
    environment; None when nothing did."""
    build_error = view.get("build_error")
    if build_error:
        return f"building the predictor failed: {build_error.get('message', '')}"
    environment = view.get("environment") or {}
    if environment.get("state") == "failed":
        return f"building the environment failed: {environment.get('error', '')}"
    return None


def api_status(view: Mapping[str, Any], replicas: Sequence[Mapping[str, Any]] = ()) -> str:
    """An API's status: `error` when something failed, a realtime API's from its replicas, else `live`."""
    if failure_of(view) is not None:
        return "error"
    if view.get("kind") == ApiKind.REALTIME:
        return realtime_status(str(view.get("bundle", "")), replicas)
    return "live"
