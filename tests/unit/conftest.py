"""The fast tier's rules, held for every test under tests/unit (what `make check` runs after every edit).

A fast test starts no process, never sleeps and talks to no Redis: it drives clocks and loops one
step at a time, waits on a `threading.Event` or `Condition` (timeouts allowed) or joins a thread,
and uses the in-memory fakes. A test that breaks a rule fails, naming the call and where it was
made; what needs real servers or processes belongs in tests/integration/ (`make test` runs both).

Held by wrapping, for the duration of each unit test's setup, call and teardown:
  - `subprocess.Popen` (its `_execute_child`, so `run`, `check_output` and asyncio's too), `os.fork`,
    `os.posix_spawn`, `os.posix_spawnp` and `os.system`;
  - `time.sleep`;
  - redis-py's connection (`connect_check_health`, what every command's first use goes through);
and by refusing, before any fixture runs, the fixtures that start servers (`SERVER_FIXTURES`).
A call from a thread that the test (or its fixtures) started counts as the test's own; threads
left running by earlier tests are let be.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

HOW = ("Fast tests (tests/unit, `make check`) start no process, never sleep and use no Redis: "
       "inject a clock or a sleep function, wait on a threading.Event, use the in-memory fakes, "
       "or move the test to tests/integration/.")

# Fixtures of tests/conftest.py that start a server process.
SERVER_FIXTURES = frozenset({"redis_server", "redis_client", "s3_server", "s3_bucket", "gcs_server", "gcs_bucket"})

class FastTierViolation(pytest.fail.Exception):  # type: ignore[misc, name-defined]
    """A unit test started a process, slept or reached for Redis (a BaseException: no `except Exception` hides it)."""


class _Guard:
    """What one test may not do, and what it did anyway."""

    def __init__(self, nodeid: str, foreign: set[threading.Thread]) -> None:
        self.nodeid = nodeid
        self.foreign = foreign  # threads of earlier tests: not this test's doing
        self.violations: list[str] = []

    def owns_current_thread(self) -> bool:
        return threading.current_thread() not in self.foreign

    def refuse(self, what: str) -> None:
        message = f"{self.nodeid} {what} ({_caller()}). {HOW}"
        self.violations.append(message)
        raise FastTierViolation(message, pytrace=False)


_active: _Guard | None = None
_foreign_key = pytest.StashKey[set[threading.Thread]]()


def _caller() -> str:
    """Where the forbidden call came from: the innermost frame in the repository, outside this file."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        path = Path(frame.filename)
        if path != Path(__file__) and ROOT in path.parents and ".venv" not in path.parts:
            return f"{path.relative_to(ROOT)}:{frame.lineno}"
    return "outside the repository"


def _wrap(owner: Any, name: str, describe: Callable[..., str]) -> tuple[Any, str, Any] | None:
    original = getattr(owner, name, None)
    if original is None:
        return None

    def guarded(*args: Any, **kwargs: Any) -> Any:
        guard = _active
        if guard is not None and guard.owns_current_thread():
            guard.refuse(describe(*args, **kwargs))
        return original(*args, **kwargs)

    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, guarded)
    return owner, name, original


def _install() -> list[tuple[Any, str, Any]]:
    def popen(_self: Any, args: Any, *rest: Any, **kwargs: Any) -> str:
        return f"started a process: {args if isinstance(args, str) else ' '.join(map(str, args))[:120]}"

    wrapped = [
        _wrap(subprocess.Popen, "_execute_child", popen),
        _wrap(os, "fork", lambda *a, **k: "forked a process (os.fork)"),
        _wrap(os, "posix_spawn", lambda path, *a, **k: f"started a process: {path}"),
        _wrap(os, "posix_spawnp", lambda path, *a, **k: f"started a process: {path}"),
        _wrap(os, "system", lambda command, *a, **k: f"started a process: {command}"),
        _wrap(time, "sleep", lambda seconds=None, *a, **k: f"called time.sleep({seconds})"),
    ]
    try:
        from redis import connection
    except ImportError:  # pragma: no cover - redis-py is part of the server extra
        pass
    else:
        wrapped.append(_wrap(connection.AbstractConnection, "connect_check_health",
                             lambda self, *a, **k: f"opened a Redis connection ({_address(self)})"))
    return [w for w in wrapped if w is not None]


def _address(connection: Any) -> str:
    host, port, path = (getattr(connection, name, None) for name in ("host", "port", "path"))
    return f"{host}:{port}" if host else str(path)


_installed = _install()


def pytest_unconfigure(config: pytest.Config) -> None:
    for owner, name, original in reversed(_installed):
        setattr(owner, name, original)
    _installed.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    asked = sorted(SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))
    if asked:
        raise FastTierViolation(f"{item.nodeid} asks for {', '.join(asked)}, which start servers. {HOW}",
                                pytrace=False)
    item.stash[_foreign_key] = set(threading.enumerate()) - {threading.current_thread()}
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    if _foreign_key not in item.stash:
        return (yield)
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    # After the session's last test its session fixtures stop too: only the test's own teardown is
    # held to the rules.
    if _foreign_key not in item.stash or nextitem is None:
        return (yield)
    return (yield from _guarded(item))


def _guarded(item: pytest.Item) -> Generator[None, Any, Any]:
    global _active
    guard = _Guard(item.nodeid, item.stash[_foreign_key])
    _active = guard
    try:
        result = yield
    except FastTierViolation:
        raise
    except BaseException as error:
        if guard.violations:  # a thread of the test broke a rule, and the test failed for it
            raise FastTierViolation("\n".join(guard.violations), pytrace=False) from error
        raise
    finally:
        _active = None
    if guard.violations:  # broken in a thread of the test, whose failure the test did not see
        raise FastTierViolation("\n".join(guard.violations), pytrace=False)
    return result
