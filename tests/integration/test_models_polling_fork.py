"""A model manager's live reloading across a fork: a forked child (a gunicorn worker forked from a
preloading master) starts its own poller on first use. A real fork; the rest of the manager is
tested fast in tests/unit/test_models_manager.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from predictors_runtime.config import ModelsConfig
from predictors_runtime.models import ModelManager
from tests.unit.test_models_manager import Loader, manager_for, write

pytestmark = pytest.mark.integration


@pytest.fixture
def versioned(tmp_path: Path) -> tuple[ModelManager, Path]:
    """A `models.path` with versions 1 and 2, and its manager."""
    root = tmp_path / "store" / "iris"
    write(root, "1/model.txt", "one")
    write(root, "2/model.txt", "two")
    return manager_for(ModelsConfig(path=str(root)), tmp_path / "cache", Loader()), root


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_poller_on_first_use(versioned: tuple[ModelManager, Path]) -> None:
    manager, _ = versioned
    manager.start_polling()
    try:
        read, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave without running pytest's teardown
            try:
                report = [manager._thread is None]
                manager.get()
                report.append(manager._thread is not None and manager._thread.is_alive())
                os.write(write_end, repr(report).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read) as pipe:
            answer = pipe.read()
        os.waitpid(pid, 0)
        assert answer == "[True, True]"
    finally:
        manager.stop_polling()
