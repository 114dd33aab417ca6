"""Children tied to their parent's life (`foundation/processes.py`): a child whose parent dies is
signalled by the kernel, and one whose parent died while it was being forked (before the kernel
was asked) signals itself, so that no haproxy, replica or node outlives the process that owns it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from foundation.processes import die_with_parent

pytestmark = pytest.mark.integration


def test_a_child_whose_parent_is_already_gone_ends_at_once() -> None:
    # The parent it names is not its parent: as if that parent died between fork and prctl.
    child = subprocess.Popen(["sleep", "30"], preexec_fn=die_with_parent(parent_pid=1))
    assert child.wait(timeout=10) == -signal.SIGTERM


def test_a_child_ends_when_its_parent_is_killed() -> None:
    # A middle process starts a long child tied to itself, prints the child's pid, then waits.
    middle = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         "from foundation.processes import die_with_parent\n"
         "child = subprocess.Popen(['sleep', '30'], preexec_fn=die_with_parent(os.getpid()))\n"
         "print(child.pid, flush=True)\n"
         "time.sleep(30)\n"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert middle.stdout is not None
    child_pid = int(middle.stdout.readline())
    middle.kill()
    middle.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(child_pid):
        assert time.monotonic() < deadline, "the child outlived its killed parent"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
