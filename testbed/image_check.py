"""`make image`: the CPU image built from the lock, then a batch job and a realtime call with every role
in a container of its own (`python -m testbed.image_check`).

The engine: the one `docker info` answers, where there is one. Otherwise, as root with Debian's
docker.io (which `make image` installs), a private dockerd started for the check and stopped after
it: host networking only (no bridge, no iptables rules, no NAT: it changes nothing of the host's
network), its own socket and data folder (`SLUICE_IMAGE_CHECK_DIR`, kept so that the next run reuses
its layers). The build needs BuildKit, which Docker 20.10's daemon has built in and a newer client
reaches through its buildx plugin. Where no engine starts, the check says why and exits 0: skipped,
not failed.

The base: `python:3.11-slim-bookworm` where the engine has it or can pull it; otherwise a stand-in
with the same Debian and Python made by debootstrap from Debian's archive
(`sluice-testbed/python:3.11-slim-bookworm`, kept by the engine). A machine whose HTTPS is
re-signed by a proxy gives the build its CA bundle as the build secret `build_ca` (never a layer).

Then: a redis-server of the check's own on loopback; the API (gunicorn), the proxy, a CPU worker,
beat and a replicas host each in a container (host networking, the storage a shared bind mount);
this checkout's `sluice` client deploys examples/iris-onnx, runs its 150 sample rows as a job and
reads the rows it wrote, then deploys examples/iris-realtime and calls it through the proxy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import requests

from sluice.client import Client, ClientError
from sluice.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("SLUICE_IMAGE_CHECK_DIR", "/var/tmp/sluice-image-check"))
IMAGE = "sluice:image-check"
BASE = "python:3.11-slim-bookworm"
STAND_IN = "sluice-testbed/python:3.11-slim-bookworm"
CONTAINER_PREFIX = "sluice-image-check-"
API_KEY = "image-check-key"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
CA_BUNDLES = (os.environ.get("SSL_CERT_FILE", ""), "/etc/ssl/certs/ca-certificates.crt")


class Skipped(Exception):
    """No engine to build or run the image with: the check has nothing to check here."""


class CheckFailed(Exception):
    """The image did not build, or a role in it did not do its part."""


@dataclass
class Engine:
    """A Docker client and the engine it talks to; `stop` ends an engine the check started."""

    client: str
    env: dict[str, str]
    started: subprocess.Popen[bytes] | None = None
    log: list[str] = field(default_factory=list)

    def run(self, *args: str, check: bool = True, timeout: float = 900, quiet: bool = True,
            stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run([self.client, *args], env=self.env, input=stdin, timeout=timeout,
                              capture_output=quiet, check=False)
        if check and done.returncode != 0:
            raise CheckFailed(f"docker {' '.join(args[:3])} ... failed ({done.returncode}): "
                              f"{(done.stderr or b'').decode(errors='replace')[-2000:]}")
        return done

    def has_image(self, name: str) -> bool:
        return self.run("image", "inspect", name, check=False).returncode == 0

    def stop(self) -> None:
        if self.started is not None and self.started.poll() is None:
            self.started.terminate()
            try:
                self.started.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.started.kill()


def say(text: str) -> None:
    print(f"image check: {text}", flush=True)


# -- the engine ----------------------------------------------------------------------------------
def buildkit_client(env: dict[str, str]) -> str:
    """A docker client that builds with BuildKit: one with the buildx plugin, or Debian's 20.10 (which
    asks the daemon's own BuildKit when DOCKER_BUILDKIT=1); a newer client without buildx cannot."""
    candidates = [found for found in (shutil.which("docker"), "/usr/bin/docker") if found and Path(found).exists()]
    for client in dict.fromkeys(candidates):
        if subprocess.run([client, "buildx", "version"], env=env, capture_output=True, check=False).returncode == 0:
            return client
        version = subprocess.run([client, "version", "--format", "{{.Client.Version}}"], env=env,
                                 capture_output=True, text=True, check=False).stdout.strip()
        if version and int(version.split(".")[0]) < 23:
            return client
    raise Skipped("no docker client that builds with BuildKit (a client of Docker 23+ needs its buildx plugin; "
                  "Debian's docker.io 20.10 has one)")


def answers(client: str, env: dict[str, str]) -> bool:
    return subprocess.run([client, "info"], env=env, capture_output=True, check=False, timeout=30).returncode == 0


def engine() -> Engine:
    """The engine `docker info` answers, else a private dockerd of the check's own."""
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    client = buildkit_client(env)
    if answers(client, env):
        return Engine(client, env)
    dockerd = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if dockerd is None:
        raise Skipped("no engine answers and there is no dockerd to start (Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        raise Skipped("no engine answers, and starting one needs root")
    STATE.mkdir(parents=True, exist_ok=True)
    socket = STATE / "docker.sock"
    env["DOCKER_HOST"] = f"unix://{socket}"
    log_path = STATE / "dockerd.log"
    with log_path.open("wb") as log:
        started = subprocess.Popen(
            [dockerd, "--host", env["DOCKER_HOST"], "--data-root", str(STATE / "data"),
             "--exec-root", "/run/sluice-image-check", "--pidfile", str(STATE / "dockerd.pid"),
             "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and started.poll() is None:
        if answers(client, env):
            say(f"started a private dockerd (host networking only; its log: {log_path})")
            return Engine(client, env, started)
        time.sleep(0.5)
    started.kill()
    tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
    raise Skipped("dockerd did not start here: " + " | ".join(tail))


# -- the base image ------------------------------------------------------------------------------
def base_image(docker: Engine) -> str:
    """python:3.11-slim-bookworm where it can be had, else the debootstrap stand-in (made once)."""
    if docker.has_image(BASE):
        return BASE
    with suppress(subprocess.TimeoutExpired):
        if docker.run("pull", BASE, check=False, timeout=120).returncode == 0:
            return BASE
    if docker.has_image(STAND_IN):
        say(f"{BASE} cannot be pulled here: using the stand-in {STAND_IN} made before")
        return STAND_IN
    if shutil.which("debootstrap") is None:
        raise Skipped(f"{BASE} cannot be pulled and debootstrap is missing to make a stand-in "
                      "(Debian: apt-get install debootstrap)")
    say(f"{BASE} cannot be pulled here: making a stand-in with debootstrap (Debian bookworm, Python 3.11)")
    with tempfile.TemporaryDirectory(prefix="sluice-base-", dir=STATE) as folder:
        rootfs = Path(folder) / "rootfs"
        packages = "python3,python3-pip,python3-venv,ca-certificates"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={packages}", "bookworm", str(rootfs),
                        DEBIAN_MIRROR], check=True, stdout=subprocess.DEVNULL)
        # What the official image gives that Debian's packages do not: `python` and `pip` by those
        # names, and a pip that installs into the system (no PEP 668 marker; the image is its own).
        for name, target in (("python", "python3"), ("pip", "pip3")):
            if not (rootfs / "usr/bin" / name).exists():
                (rootfs / "usr/bin" / name).symlink_to(target)
        for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        docker.run("import", "--change", "CMD [\"python3\"]", "-", STAND_IN, stdin=tar)
    return STAND_IN


# -- build and run -------------------------------------------------------------------------------
def build(docker: Engine, base: str) -> float:
    """Build the CPU image; the seconds it took."""
    secret: list[str] = []
    ca = next((path for path in CA_BUNDLES if path and Path(path).is_file()), None)
    if ca is not None:
        secret = ["--secret", f"id=build_ca,src={ca}"]
    started = time.monotonic()
    docker.run("build", "--network", "host", "-f", "docker/Dockerfile", "--build-arg", f"PYTHON_IMAGE={base}",
               *secret, "-t", IMAGE, str(ROOT), quiet=False, timeout=1800)
    return time.monotonic() - started


@contextmanager
def roles(docker: Engine, redis_url: str, storage: Path, api_port: int, proxy_port: int) -> Iterator[None]:
    """The API, the proxy, a CPU worker, beat and a replicas host, each in a container."""
    public = f"http://127.0.0.1:{proxy_port}"
    env = {"SLUICE_REDIS_URL": redis_url, "SLUICE_API_KEYS": API_KEY, "SLUICE_API_KEY": API_KEY,
           "SLUICE_STORAGE": "/data/storage", "SLUICE_API_URL": public, "SLUICE_URL": public,
           "SLUICE_LOCAL_INPUT_ROOTS": "/data/storage"}
    commands: dict[str, Sequence[str]] = {
        "api": ["gunicorn", "-c", "python:api.gunicorn_config", "-b", f"127.0.0.1:{api_port}", "api:create_app()"],
        "proxy": ["sluice", "proxy", "--port", str(proxy_port), "--bind", "127.0.0.1",
                  "--management", f"127.0.0.1:{api_port}"],
        "worker": ["celery", "-A", "jobs", "worker", "-Q", "cpu", "--hostname", "cpu@image-check"],
        "beat": ["celery", "-A", "jobs", "beat", "--schedule", "/tmp/celerybeat-schedule"],
        "replicas": ["sluice", "replicas", "--cpu", "--host", "127.0.0.1"],
    }
    remove_containers(docker)
    try:
        for role, command in commands.items():
            settings = [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
            docker.run("run", "-d", "--name", CONTAINER_PREFIX + role, "--network", "host",
                       "-v", f"{storage}:/data/storage", *settings, IMAGE, "tini", "--", *command)
        yield
    finally:
        for role in commands:
            logs = docker.run("logs", "--tail", "15", CONTAINER_PREFIX + role, check=False)
            docker.log.append(f"--- {role}\n{(logs.stdout + logs.stderr).decode(errors='replace')}")
        remove_containers(docker)


def remove_containers(docker: Engine) -> None:
    listed = docker.run("ps", "-aq", "--filter", f"name={CONTAINER_PREFIX}", check=False).stdout.decode().split()
    if listed:
        docker.run("rm", "-f", *listed, check=False)


@contextmanager
def redis_server() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


def wait_healthy(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with suppress(requests.RequestException):
            if requests.get(f"{url}/healthz", timeout=3).status_code == 200:
                return
        time.sleep(0.5)
    raise CheckFailed(f"{url}/healthz did not answer 200 within {timeout:.0f} s")


def batch_job(client: Client, storage: Path) -> str:
    """examples/iris-onnx's sample as a job; a line on what it did."""
    project = ROOT / "examples" / "iris-onnx"
    subprocess.run([sys.executable, str(project / "train.py")], check=True, stdout=subprocess.DEVNULL)
    name = client.deploy(project / "cortex.yaml")[0]["name"]
    items = json.loads((project / "sample.json").read_text())
    job = client.submit_raw(name, {"workers": 1, "item_list": {"items": items, "batch_size": 10},
                                   "output": {"path": "/data/storage/outputs", "format": "jsonl"}})
    final = client.wait(name, job["job_id"], timeout=300)
    if final["status"] != "status_succeeded":
        raise CheckFailed(f"the batch job ended {final['status']}: {json.dumps(final)[:2000]}")
    rows = [line for path in (storage / "outputs" / job["job_id"]).glob("*.jsonl")
            for line in path.read_text().splitlines() if line.strip()]
    if len(rows) != len(items):
        raise CheckFailed(f"the batch job wrote {len(rows)} rows for {len(items)} items")
    return f"batch job {job['job_id']} on {name}: {final['status']}, {len(rows)} rows written"


def realtime_call(client: Client, url: str) -> str:
    """examples/iris-realtime deployed and called through the proxy; a line on what it answered."""
    project = ROOT / "examples" / "iris-realtime"
    subprocess.run([sys.executable, str(project / "train.py")], check=True, stdout=subprocess.DEVNULL)
    name = client.deploy(project / "cortex.yaml")[0]["name"]
    client.wait_ready(name, timeout=180)
    flower = {"sepal_length": 5.2, "sepal_width": 3.6, "petal_length": 1.4, "petal_width": 0.3}
    answer = requests.post(f"{url}/{name}", json=flower, timeout=60)
    if answer.status_code != 200:
        raise CheckFailed(f"POST /{name} answered {answer.status_code}: {answer.text[:500]}")
    return f"realtime call to {name} through the proxy: 200 {answer.text.strip()[:120]}"


def check(docker: Engine) -> list[str]:
    base = base_image(docker)
    seconds = build(docker, base)
    size = docker.run("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.decode().strip()
    done = [f"built {IMAGE} from uv.lock on {base} in {seconds:.0f} s ({int(size) / 1e6:.0f} MB)"]
    leftovers = docker.run("run", "--rm", IMAGE, "sh", "-c", "ls -d /app/build /app/*.egg-info 2>/dev/null || true")
    if leftovers.stdout.strip():
        raise CheckFailed(f"the build left {leftovers.stdout.decode().split()} in /app")
    with tempfile.TemporaryDirectory(prefix="sluice-image-storage-") as folder, redis_server() as redis_url:
        storage = Path(folder)
        os.chown(storage, 1000, 1000) if os.geteuid() == 0 else storage.chmod(0o777)
        api_port, proxy_port = free_port(), free_port()
        url = f"http://127.0.0.1:{proxy_port}"
        with roles(docker, redis_url, storage, api_port, proxy_port):
            wait_healthy(url)
            client = Client(url, api_key=API_KEY)
            done.append(batch_job(client, storage))
            done.append(realtime_call(client, url))
            done.append("roles in containers: api (gunicorn), proxy (haproxy), worker, beat, replicas")
    return done


def main() -> int:
    try:
        docker = engine()
    except Skipped as skipped:
        say(f"skipped: {skipped}")
        return 0
    try:
        for line in check(docker):
            say(line)
        say("passed")
        return 0
    except (CheckFailed, ClientError, subprocess.CalledProcessError, subprocess.TimeoutExpired, TimeoutError) as failed:
        say(f"FAILED: {failed}")
        print("\n".join(docker.log), file=sys.stderr)
        return 1
    except Skipped as skipped:
        say(f"skipped: {skipped}")
        return 0
    finally:
        docker.stop()


if __name__ == "__main__":
    sys.exit(main())
