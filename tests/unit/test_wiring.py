"""One wiring point per process (`jobs/wiring.py`): a process's services are built once, whoever asks first
(a node's hooks, its tasks, beat, the API), and each Celery app has its own tasks and services.

Building `Services` contacts no Redis (clients connect on first use), so nothing here needs a server.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from foundation.settings import Settings
from jobs.celery_app import create_celery
from jobs.nodes.worker_node import SettleOnConnect
from jobs.placement.batch import Placement
from jobs.tasks import FINISH_JOB, RUN_BATCH
from jobs.wiring import init_services

SETTINGS = Settings(redis_url="redis://127.0.0.1:1/0")  # never reached


def test_a_process_builds_its_services_once_whoever_asks() -> None:
    app = create_celery(SETTINGS)
    [step] = [cls for cls in app.steps["consumer"] if issubclass(cls, SettleOnConnect)]

    services = init_services(app, SETTINGS)

    assert init_services(app, SETTINGS) is services
    assert step(SimpleNamespace())._services() is services  # the node's settle-on-connect hook's
    placement = services.placement
    assert isinstance(placement, Placement) and placement.nodes is services.nodes  # one registry, one client


def test_a_forked_child_builds_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_celery(SETTINGS)
    parents = init_services(app, SETTINGS)
    monkeypatch.setattr("jobs.wiring.os.getpid", lambda: -1)

    assert init_services(app, SETTINGS) is not parents


def test_each_app_has_its_own_services_and_its_own_tasks() -> None:
    api, node = create_celery(SETTINGS), create_celery(SETTINGS)

    assert init_services(api, SETTINGS) is not init_services(node, SETTINGS)
    for name in (RUN_BATCH, FINISH_JOB):
        assert api.tasks[name].run is not node.tasks[name].run
