"""One haproxy master, as the proxy controller (`sluice/proxy.py`) runs it: its configuration
written atomically and checked before use, the process started in master-worker mode and tied to
its controller's life, hitless reloads, and what its master CLI and stats socket say.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from foundation.errors import ConfigError, NotReady
from foundation.processes import die_with_parent

_SOCKET_PATH_MAX = 97  # haproxy refuses a longer master socket path ("max 97"), below sun_path's 108 bytes
# haproxy's OS scheduling priority (a nice value). Its one thread forwards every request; on a host
# whose cores the replicas keep busy it waited for a core between a replica's answer and the next
# request, leaving the replicas idle meanwhile: at -10 the hop took 0.90-0.99x of a replica's
# requests/s instead of 0.83-0.88x (bench/proxy_hop.py, 2 cores). Lowering the nice value needs
# root or CAP_SYS_NICE; without either haproxy runs at the controller's priority.
PRIORITY_VARIABLE = "SLUICE_PROXY_PRIORITY"
DEFAULT_PRIORITY = -10
log = logging.getLogger(__name__)


def proxy_priority(env: Mapping[str, str] | None = None) -> int:
    """The nice value haproxy asks for: SLUICE_PROXY_PRIORITY (-20 to 19), else -10."""
    env = os.environ if env is None else env
    raw = (env.get(PRIORITY_VARIABLE) or "").strip()
    if not raw:
        return DEFAULT_PRIORITY
    try:
        value = int(raw)
    except ValueError:
        value = 99
    if not -20 <= value <= 19:
        raise ConfigError(f"{PRIORITY_VARIABLE} must be a nice value from -20 to 19 (got {raw!r})")
    return value


def _prioritised(then: Callable[[], None], priority: int) -> Callable[[], None]:
    """A preexec_fn: the child asks for `priority` (kept at its parent's when not allowed), then `then`."""

    def preexec() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, priority)
        then()

    return preexec


@dataclass(frozen=True)
class HAProxyState:
    """What the master CLI says: reloads done (and failed), workers, and the config the current one runs."""

    reloads: int
    failed: int
    workers: tuple[int, ...]
    old_workers: tuple[int, ...]
    tag: str


def find_haproxy() -> str:
    """haproxy's path: on PATH, or where Debian puts it (/usr/sbin is not on every user's PATH)."""
    found = shutil.which("haproxy")
    if found:
        return found
    return "/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else "haproxy"


class HAProxy:
    """A haproxy master in master-worker mode, its configuration file and CLI in `state_dir`."""

    def __init__(self, state_dir: Path, executable: str | None = None, priority: int | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.priority = proxy_priority() if priority is None else priority
        self.executable = executable or find_haproxy()
        self.config_path = self.state_dir / "haproxy.cfg"
        self.log_path = self.state_dir / "haproxy.log"
        socket_path = self.state_dir / "master.sock"
        self._socket_dir: Path | None = None
        if len(str(socket_path)) > _SOCKET_PATH_MAX:
            self._socket_dir = Path(tempfile.mkdtemp(prefix="sluice-proxy-"))
            socket_path = self._socket_dir / "master.sock"
        self.socket_path = socket_path
        self.process: subprocess.Popen[bytes] | None = None

    # configuration
    def check(self, text: str) -> None:
        """Raise NotReady with haproxy's complaint if it would not load `text`."""
        staging = self.state_dir / ".haproxy.cfg.check"
        staging.write_text(text, encoding="utf-8")
        try:
            result = subprocess.run([self.executable, "-c", "-q", "-f", str(staging)],
                                    capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NotReady(f"cannot run {self.executable} -c: {e}") from e
        finally:
            staging.unlink(missing_ok=True)
        if result.returncode != 0:
            raise NotReady(f"haproxy rejected the configuration: {(result.stderr or result.stdout).strip()}")

    def write(self, text: str) -> None:
        """Replace the configuration atomically: a reload reads the old or the new one, whole."""
        staging = self.state_dir / ".haproxy.cfg.tmp"
        with open(staging, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, self.config_path)

    # process
    def start(self) -> None:
        if shutil.which(self.executable) is None and not os.access(self.executable, os.X_OK):
            raise NotReady(f"{self.executable} is not installed (apt-get install -y haproxy)")
        self.socket_path.unlink(missing_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [self.executable, "-W", "-S", f"{self.socket_path},mode,600", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.state_dir,
                # haproxy gets SIGTERM when its controller dies (even while it forks), so it never
                # outlives it holding the public port with a stale configuration.
                preexec_fn=_prioritised(die_with_parent(os.getpid()), self.priority),
            )
        with contextlib.suppress(OSError):
            given = os.getpriority(os.PRIO_PROCESS, self.process.pid)
            if given != self.priority:
                log.info("haproxy runs at nice %d, not the %d asked (%s needs root or CAP_SYS_NICE)",
                         given, self.priority, PRIORITY_VARIABLE)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def reload(self) -> None:
        """Hitless: the master re-executes with the new file and hands the listeners to the new worker."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGUSR2)

    def stop(self, grace: float = 10.0) -> None:
        """Soft stop (in-flight requests finish) within `grace`, then hard."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            for sig, wait in ((signal.SIGUSR1, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    process.send_signal(sig)
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if process is not None:
            process.poll()

    def close(self) -> None:
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # master CLI
    def command(self, text: str, timeout: float = 2.0) -> str:
        """One master CLI command (`@1 ...` reaches the current worker); raises OSError."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.socket_path))
            s.sendall(text.encode() + b"\n")
            s.shutdown(socket.SHUT_WR)  # non-interactive: the master answers and closes
            chunks = []
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks).decode(errors="replace")

    def state(self) -> HAProxyState | None:
        """None while the master cannot answer (starting, re-executing, dead)."""
        if not self.alive():
            return None
        try:
            proc = self.command("show proc")
            info = self.command("@1 show info")
        except OSError:
            return None
        reloads = failed = -1
        workers: list[int] = []
        old: list[int] = []
        section = ""
        for line in proc.splitlines():
            if line.startswith("#"):
                section = line.strip("# ").lower()
                continue
            parts = line.split()
            if len(parts) < 3 or not parts[0].isdigit():
                continue
            if parts[1] == "master":
                reloads = int(parts[2]) if parts[2].isdigit() else -1
                match = re.search(r"failed:\s*(\d+)", line)
                failed = int(match.group(1)) if match else 0
            elif section == "workers":
                workers.append(int(parts[0]))
            elif section == "old workers":
                old.append(int(parts[0]))
        if reloads < 0:
            return None
        match = re.search(r"^description:\s*sluice-([0-9a-f]+)\s*$", info, re.MULTILINE | re.IGNORECASE)
        return HAProxyState(reloads, failed, tuple(workers), tuple(old), match.group(1) if match else "")

    def stats(self, pid: int | None = None) -> list[dict[str, str]]:
        """`show stat` of worker `pid` (default: the current one), one dict per proxy/server row
        (qcur, scur, ...)."""
        text = self.command(f"@!{pid} show stat" if pid is not None else "@1 show stat")
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines or not lines[0].startswith("# "):
            return []
        header = lines[0][2:].split(",")
        return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]
