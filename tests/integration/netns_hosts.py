"""Two hosts on one machine: Linux network namespaces joined by a veth pair stand in for two machines.

Each host is a network namespace with one address on the link; every process started on it also
gets a UTS namespace of its own under the host's name, so `socket.gethostname()` (and Celery's
`%h`) says `host-a` or `host-b` as it would on two machines. The test looks on from a host through
`LookFrom`: calls run on one thread that joined the host's network namespace.

Shared by the tests that need two real hosts (test_two_hosts.py, test_autoscaling_two_hosts.py).
Namespaces need root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2 and util-linux; where one
is missing or refused, `make_hosts` skips the test with the reason.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

SUBNET_PREFIX = 24
ADDRESS_A, ADDRESS_B = "10.77.0.1", "10.77.0.2"
CLONE_NEWNET = 0x40000000


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def enter_network_namespace(name: str) -> None:
    """Move the calling thread (only it: a network namespace is per thread) into namespace `name`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


@dataclass
class Host:
    """A machine: a network namespace with one address on the link, and the processes started in it."""

    label: str          # its host name, as its processes see it
    namespace: str      # the network namespace's name (unique per run)
    address: str
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        """Start `argv` on this host: in its network namespace, under its host name."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "--",
                 "sh", "-c", 'hostname "$0" && exec "$@"', self.label, *argv],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True,
            )
        self.processes[name] = process
        return process

    def pids(self) -> list[int]:
        """Every process running on this host (in its network namespace), whoever started it."""
        listed = _ip("netns", "pids", self.namespace)
        return [int(pid) for pid in listed.stdout.split()] if listed.returncode == 0 else []

    def kill_everything(self, timeout: float = 10.0) -> None:
        """SIGKILL every process of the host, as a power cut would; returns once none is left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        assert not self.pids(), f"processes left on {self.label}: {self.pids()}"

    def logs(self, lines: int = 30) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {self.label}: {path.stem} -----\n" + "\n".join(tail))
        return "\n".join(parts)


class LookFrom:
    """Runs calls on one thread that joined a host's network namespace (the test's seat on that host)."""

    def __init__(self, host: Host) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"on-{host.label}",
                                            initializer=enter_network_namespace, initargs=(host.namespace,))

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._executor.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def namespaces_refused() -> str:
    """Why this machine cannot make network namespaces for a test ("" when it can): the tools are
    missing, or `ip netns add` is not permitted (it needs root or CAP_SYS_ADMIN)."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) is not installed"
    probe = f"sluice-probe-{uuid.uuid4().hex[:6]}"
    created = _ip("netns", "add", probe)
    if created.returncode != 0:
        return f"`ip netns add` is not permitted here ({created.stderr.strip()}); it needs root or CAP_SYS_ADMIN"
    _ip("netns", "del", probe)
    return ""


def make_hosts(tmp: Path) -> tuple[Host, Host]:
    """Two namespaces joined by a veth pair, `lo` up in each; skips when namespaces are refused."""
    refused = namespaces_refused()
    if refused:
        pytest.skip(f"two-host test: {refused}")
    run = uuid.uuid4().hex[:6]
    a = Host("host-a", f"sluice-a-{run}", ADDRESS_A, tmp / "host-a")
    b = Host("host-b", f"sluice-b-{run}", ADDRESS_B, tmp / "host-b")
    try:
        steps = [
            ("netns", "add", a.namespace),
            ("netns", "add", b.namespace),
            ("link", "add", f"va-{run}", "netns", a.namespace, "type", "veth", "peer", "name", f"vb-{run}",
             "netns", b.namespace),
            ("-n", a.namespace, "addr", "add", f"{a.address}/{SUBNET_PREFIX}", "dev", f"va-{run}"),
            ("-n", b.namespace, "addr", "add", f"{b.address}/{SUBNET_PREFIX}", "dev", f"vb-{run}"),
            ("-n", a.namespace, "link", "set", f"va-{run}", "up"),
            ("-n", b.namespace, "link", "set", f"vb-{run}", "up"),
            ("-n", a.namespace, "link", "set", "lo", "up"),
            ("-n", b.namespace, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                raise RuntimeError(f"ip {' '.join(step)}: {done.stderr.strip()}")
    except BaseException:
        remove_hosts(a, b)
        raise
    return a, b


def remove_hosts(*hosts: Host) -> None:
    """Kill whatever still runs on the hosts and delete their namespaces (which removes the veth pair)."""
    for host in hosts:
        for pid in host.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in host.processes.values():
            if process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        _ip("netns", "del", host.namespace)


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll `check` until it returns something true; its exceptions count as "not yet" (a server on
    another host still starting refuses connections)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - a server still starting refuses connections
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last!r})")
