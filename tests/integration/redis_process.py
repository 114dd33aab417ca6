"""A redis-server that a test owns: stalled (SIGSTOP / SIGCONT), killed (SIGKILL) and restarted on
its append-only file, on the same port and folder, as an operator's Redis would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from sluice.embedded import free_port

# A predictor whose calls leave JSON lines in `config["events"]`, and that can stall Redis itself at
# the one moment a test needs: after the predict call holding `stall_redis_after` (the batch's
# outcome is recorded next), or inside `on_job_complete` (`stall_in_complete`). It sends SIGSTOP
# and leaves a detached `sleep; kill -CONT` behind, so Redis wakes up whatever happens to the test.
FAULTS_PREDICTOR = '''
import json, os, signal, subprocess, time


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config
        self.job_id = job_spec["job_id"]
        self.count = 0

    def _log(self, record):
        record.update(pid=os.getpid(), job_id=self.job_id, at=time.time())
        with open(self.config["events"], "a") as f:
            f.write(json.dumps(record) + "\\n")

    def _stall_redis(self, why):
        marker = self.config["stall_marker"]
        if os.path.exists(marker):  # once per job, whatever is retried
            return
        with open(marker, "w") as f:
            f.write(json.dumps({"at": time.time(), "why": why, "pid": os.getpid()}))
        pid, seconds = self.config["redis_pid"], self.config.get("stall_s", 8)
        os.kill(pid, signal.SIGSTOP)
        subprocess.Popen(["/bin/sh", "-c", f"sleep {seconds}; kill -CONT {pid}"], start_new_session=True)

    def predict(self, payload, batch_id):
        items = [item["n"] if isinstance(item, dict) else item for item in payload]
        self._log({"event": "predict", "batch_id": batch_id, "count": len(items), "first": items[0],
                   "last": items[-1], "items": items if len(items) <= 100 else None})
        if self.config.get("sleep"):
            time.sleep(self.config["sleep"])
        self._log({"event": "done", "batch_id": batch_id, "count": len(items), "first": items[0],
                   "last": items[-1], "items": items if len(items) <= 100 else None})
        if self.config.get("stall_redis_after") in items:
            self._stall_redis("last batch")
        self.count += len(items)

    def on_job_complete(self, job_status):
        self._log({"event": "complete", "count": self.count})
        if self.config.get("stall_in_complete"):
            self._stall_redis("completion")
'''


class RedisProcess:
    """redis-server with `--appendonly yes` in `folder`: every acknowledged write survives SIGKILL."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> RedisProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - handed to the child, closed here once it has it
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        client = redis.Redis(port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                return self
            except (redis.ConnectionError, redis.TimeoutError):  # BusyLoadingError is a ConnectionError
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save; what it acknowledged is in its append-only file."""
        assert self.process is not None
        self.resume()
        self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        """Start again on the same port and folder: it loads its append-only file."""
        self.start()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)

    @property
    def paused(self) -> bool:
        """Stopped by a signal (state 'T'), by this test or by a predictor."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "T"
        except (OSError, IndexError):
            return False

    @contextmanager
    def stalled(self, seconds: float) -> Iterator[None]:
        """Redis stopped for `seconds` in the background while the block runs (which may wait on it)."""
        waker = self.stall_in_background(seconds)
        try:
            yield
        finally:
            waker.join()

    def stall_in_background(self, seconds: float) -> threading.Thread:
        self.pause()
        waker = threading.Timer(seconds, self.resume)
        waker.start()
        return waker

    def stall(self, seconds: float) -> None:
        """SIGSTOP now, SIGCONT `seconds` later; returns when Redis runs again."""
        self.stall_in_background(seconds).join()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def read_marker(path: Path) -> dict[str, Any] | None:
    """The predictor's note of the stall it caused, once written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
