"""The fast tier's guard (tests/unit/conftest.py) fails a unit test that sleeps, starts a process,
reaches for Redis or asks for a server fixture, whatever the test does with the error; waiting on
an event stays allowed.

Each case is a unit test of a scratch project holding a copy of the guard, run by pytest in a
process of its own.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

GUARD = Path(__file__).resolve().parents[1] / "unit" / "conftest.py"

ROOT_CONFTEST = '''
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def redis_server():
    Path("redis-server-started").touch()
    yield "redis://127.0.0.1:1/0"
'''

CASES = '''
import os
import subprocess
import threading
import time

import redis

later = threading.Event()
slept = threading.Event()


def test_sleeps():
    time.sleep(0.01)


def test_swallows_the_failure_of_its_sleep():
    try:
        time.sleep(0.01)
    except Exception:
        pass


def test_sleeps_in_a_thread_of_its_own():
    thread = threading.Thread(target=time.sleep, args=(0.01,))
    thread.start()
    thread.join()


def test_starts_a_process():
    subprocess.run(["true"], check=True)


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)


def test_connects_to_redis():
    try:
        redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.1).ping()
    except redis.RedisError:
        pass


def test_asks_for_a_server(redis_server):
    pass


def test_waits_on_an_event():
    assert not threading.Event().wait(0.01)


def test_leaves_a_thread_that_sleeps_later():
    def later_sleep():
        later.wait(5)
        time.sleep(0.01)
        slept.set()

    threading.Thread(target=later_sleep, daemon=True).start()


def test_is_not_blamed_for_an_earlier_tests_thread():
    later.set()
    assert slept.wait(5)
'''

@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """test name -> (PASSED/FAILED/ERROR, what pytest printed about it)."""
    root = tmp_path_factory.mktemp("fast-tier")
    (root / "tests" / "unit").mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text(ROOT_CONFTEST)
    shutil.copy(GUARD, root / "tests" / "unit" / "conftest.py")
    (root / "tests" / "unit" / "test_cases.py").write_text(textwrap.dedent(CASES))
    done = subprocess.run(
        # No pyproject.toml there, so its addopts' `-p no:cloudcoil` (a plugin the KEDA models bring) is given here.
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:cloudcoil", "-rA", "-q",
         "--rootdir", str(root),
         "tests/unit/test_cases.py"],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "2000"},  # the summary lines whole
    )
    found: dict[str, tuple[str, str]] = {}
    for status, name, rest in re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\w+)(.*)$", done.stdout, re.M):
        found[name] = (status, rest)
    assert found, done.stdout + done.stderr
    found["redis_server fixture"] = ("RAN" if (root / "redis-server-started").exists() else "NOT RUN", "")
    return found


@pytest.mark.parametrize(("test", "said"), [
    ("test_sleeps", "called time.sleep(0.01)"),
    ("test_swallows_the_failure_of_its_sleep", "called time.sleep(0.01)"),
    ("test_sleeps_in_a_thread_of_its_own", "called time.sleep(0.01)"),
    ("test_starts_a_process", "started a process: true"),
    ("test_forks", "forked a process"),
    ("test_connects_to_redis", "opened a Redis connection (127.0.0.1:1)"),
])
def test_a_unit_test_that_breaks_a_rule_fails_naming_it(outcomes, test, said):
    status, message = outcomes[test]
    assert status == "FAILED" and said in message, outcomes[test]


def test_a_unit_test_asking_for_a_server_fails_before_the_server_starts(outcomes):
    status, message = outcomes["test_asks_for_a_server"]
    assert status == "ERROR" and "asks for redis_server" in message, outcomes["test_asks_for_a_server"]
    assert outcomes["redis_server fixture"][0] == "NOT RUN"


@pytest.mark.parametrize("test", ["test_waits_on_an_event", "test_leaves_a_thread_that_sleeps_later",
                                  "test_is_not_blamed_for_an_earlier_tests_thread"])
def test_what_keeps_the_rules_passes(outcomes, test):
    assert outcomes[test][0] == "PASSED", outcomes[test]
