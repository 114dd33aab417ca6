"""What each kind of Sluice process loads: a worker node, beat and a replica launcher carry none of
the management app (Flask's app, its request schemas, the OpenAPI generator).

Each is checked in a fresh interpreter, loading what that process loads: the Celery app found
and its task modules imported as `celery -A jobs worker` does, then what running a batch
imports; beat's scheduler; the `sluice serve` launcher.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules of the management app, and what only it needs.
MANAGEMENT = ("flask", "api.app", "api.openapi", "api.schemas", "jobs.batch.submission", "prometheus_client",
              "gunicorn")

_REPORT = (
    "import json, sys\n"
    f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({MANAGEMENT!r}))))\n"
)

WORKER = (
    "from celery.bin.celery import find_app\n"
    "app = find_app('jobs')\n"
    "app.loader.import_default_modules()\n"
    "import jobs.runner, jobs.batch.completion  # what a batch and a job's completion import when they run\n"
)
BEAT = "import beat.scheduler, beat.timetable\n"
LAUNCHER = "import sluice.replica, sluice.replica_manager, sluice.replica_process\n"


def _loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + _REPORT], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize("process, code", [("worker node", WORKER), ("beat", BEAT), ("replica launcher", LAUNCHER)])
def test_a_process_that_serves_no_http_api_loads_nothing_of_the_management_app(process: str, code: str) -> None:
    assert _loaded(code) == [], f"a {process} loads the management app's modules"


def test_the_check_sees_the_management_app_when_it_is_loaded() -> None:
    assert "api.app" in _loaded("import api\napi.create_app\n")
