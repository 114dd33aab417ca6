"""`sluice up` always stops, and takes everything it started with it.

As a person runs it: in a terminal, Ctrl-C in the middle of a job of an API with its own environment
(so a worker node and the node's environment process are busy), plain and through `| tee`; and
killed outright (SIGKILL, as the OOM killer does), after which the job still finishes on the next
start. The terminal is a real pseudo-terminal: Ctrl-C is the byte the keyboard sends, and the
kernel's line discipline turns it into SIGINT for the terminal's foreground processes.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import yaml

from foundation.processes import running
from sluice.client import Client
from sluice.embedded import free_port
from testbed.wheels import GREETING, GREETING_MODULE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 10  # Stack.stop's default

# A batch takes a while, and imports a package of the API's own environment.
SLOW_PREDICTOR = f'''
import time
import {GREETING_MODULE}


class PythonPredictor:
    def __init__(self, config, job_spec=None):
        self.seconds = config["seconds"]

    def predict(self, payload, batch_id=None):
        time.sleep(self.seconds)
        return [{{"item": item, "version": {GREETING_MODULE}.VERSION}} for item in payload]
'''


def environment_project(folder: Path, name: str, seconds: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(SLOW_PREDICTOR)
    (folder / "requirements.txt").write_text(f"{GREETING}==1.0.0\n")
    api = {"name": name, "kind": "BatchAPI", "compute": {"cpu": 1},
           "predictor": {"type": "python", "path": "predictor.py", "config": {"seconds": seconds}}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


class Terminal:
    """A command run as the foreground of a pseudo-terminal of its own; what it writes, kept."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()

        def take_the_terminal() -> None:  # a new session whose controlling terminal is this one
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                                        preexec_fn=take_the_terminal)
        os.close(slave)
        self.output = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                if self.process.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the terminal's last writer is gone
                return
            if not chunk:
                return
            self.output += chunk.decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            assert self.process.poll() is None, f"exited before {pattern!r}:\n{self.output}"
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.output}")

    def press_ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(timeout=5)
        os.close(self.master)


@pytest.fixture
def up_env(wheelhouse: Path) -> dict[str, str]:
    """A private Redis (none configured), requirements from the tests' wheelhouse alone."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLUICE_REDIS")}
    return {**env, "SLUICE_FIND_LINKS": str(wheelhouse), "SLUICE_NO_INDEX": "1", "SLUICE_IDLE_GRACE_S": "60"}


def up_command(port: int, data_dir: Path) -> str:
    return f"{sys.executable} -m sluice.cli up --port {port} --data-dir {data_dir}"


def every_process_under(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return "?"


@contextmanager
def watching_exits(processes: list[psutil.Process]) -> Iterator[dict[int, float]]:
    """When each of `processes` stopped running (pid -> monotonic time), polled every 20 ms."""
    ended: dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and len(ended) < len(processes):
            for process in processes:
                if process.pid not in ended and not running(process):
                    ended[process.pid] = time.monotonic()
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield ended
    finally:
        done.set()
        watcher.join()


def a_job_mid_batch(url: str, tmp_path: Path, seconds: float, root: int) -> tuple[Client, str, str]:
    """The environment API deployed and a job of it running a batch in the API's environment process
    under `root`; (client, API name, job id)."""
    client = Client(url)
    name = "stopping-env"
    client.deploy(environment_project(tmp_path / name, name, seconds))
    job = client.submit_job(name, {"workers": 1, "item_list": {"items": [1, 2, 3], "batch_size": 1}})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status = client.job(name, job["job_id"])
        assert status["status"] in ("status_enqueuing", "status_running"), status
        if status.get("phase", "").startswith("running") and the_environment_process_runs(root):
            return client, name, job["job_id"]
        time.sleep(0.2)
    raise AssertionError("no batch of the job ever ran in the API's environment")


def the_environment_process_runs(root: int) -> bool:
    return any("predictors_runtime.env" in command(p) for p in every_process_under(root))


@pytest.mark.parametrize("through_tee", [False, True], ids=["plain", "through tee"])
def test_ctrl_c_mid_job_stops_every_process_within_the_grace_redis_last_naming_what_was_killed(
    up_env: dict[str, str], tmp_path: Path, through_tee: bool,
) -> None:
    port = free_port()
    line = up_command(port, tmp_path / "home")
    argv = ["bash", "-c", f"{line} 2>&1 | tee {tmp_path / 'up.out'}"] if through_tee else line.split()
    terminal = Terminal(argv, up_env)
    try:
        url = terminal.wait_for(rf"http://127\.0\.0\.1:{port}\b", 120).group(0)
        a_job_mid_batch(url, tmp_path, seconds=120, root=terminal.process.pid)
        [up] = [p for p in [psutil.Process(terminal.process.pid), *every_process_under(terminal.process.pid)]
                if p.cmdline()[1:4] == ["-m", "sluice.cli", "up"]]
        processes = every_process_under(up.pid)  # what `sluice up` started (not bash, nor tee)
        [redis] = [p for p in processes if p.name().startswith("redis-server")]
        node = next(p for p in processes if "celery" in command(p) and " worker " in command(p))

        with watching_exits(processes) as ended:
            pressed = time.monotonic()
            terminal.press_ctrl_c()
            terminal.process.wait(timeout=STOP_GRACE_S * 3 + 30)
            left = [command(p) for p in processes if running(p)]

        assert left == []
        # Every process ended within the grace of each of the two rounds (the parts, then Redis),
        # and Redis last of all.
        assert max(ended.values()) - pressed < STOP_GRACE_S * 2 + 10, ended
        assert ended[redis.pid] == max(ended.values())
        # The node, still in its two-minute batch, was killed when the grace ran out, and named: in the
        # stack's log, and on the terminal where it is still there (tee ended with the Ctrl-C).
        note = (tmp_path / "home" / "logs" / "stack.log").read_text()
        assert "so killed:" in note and f"pid {node.pid}: " in note and "celery" in note.split("so killed:")[1]
        if not through_tee:
            terminal.wait_for(rf"so killed:[\s\S]*pid {node.pid}: ", 10)
    finally:
        terminal.close()


def test_sluice_up_killed_outright_takes_every_child_with_it_and_the_job_finishes_on_the_next_start(
    up_env: dict[str, str], tmp_path: Path,
) -> None:
    port, home = free_port(), tmp_path / "home"
    up = subprocess.Popen(up_command(port, home).split(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True, env=up_env, cwd=ROOT)
    try:
        url = up.stdout.readline().strip()  # type: ignore[union-attr]
        client, name, job_id = a_job_mid_batch(url, tmp_path, seconds=4, root=up.pid)
        processes = every_process_under(up.pid)

        up.kill()  # no handler runs: only the kernel's parent-death signal reaches the children
        up.wait()
        deadline = time.monotonic() + 90
        while any(running(p) for p in processes) and time.monotonic() < deadline:
            time.sleep(0.2)

        assert [command(p) for p in processes if running(p)] == []
        # The node finished its batch, found Redis gone, and ended rather than wait for it.
        worker_logs = "".join(path.read_text() for path in (home / "logs").glob("workers*.log"))
        assert "Redis is away and this node is stopping" in worker_logs
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()

    again = subprocess.Popen(up_command(port, home).split(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=up_env, cwd=ROOT)
    try:
        Client(again.stdout.readline().strip())  # type: ignore[union-attr]
        final = client.wait(name, job_id, timeout=180)
        assert final["status"] == "status_succeeded", final
        assert final["batch_metrics"]["succeeded"] == 3 and final["batch_metrics"]["failed"] == 0
    finally:
        again.send_signal(signal.SIGINT)
        again.wait(timeout=90)
