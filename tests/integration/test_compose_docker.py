"""`docker compose config` accepts the compose files, where docker is installed: it merges the
files, interpolates the variables and applies the profiles. The schema check of the same files
is fast: tests/unit/test_compose_schema.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_compose_schema import COMPOSE_FILES, DOCKER, HOSTS_VARIABLES

pytestmark = pytest.mark.integration


def _docker_compose() -> list[str]:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("`docker compose config` not run: docker is not installed here "
                    "(the schema check, tests/unit/test_compose_schema.py, still runs)")
    found = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if found.returncode != 0:
        pytest.skip("`docker compose config` not run: docker has no compose plugin here "
                    f"({(found.stderr or found.stdout).strip().splitlines()[0][:200]})")
    return [docker, "compose"]


@pytest.mark.parametrize("files", [COMPOSE_FILES[:1], COMPOSE_FILES], ids=["one-host", "across-hosts"])
@pytest.mark.parametrize("profile", [None, "gpu"])
def test_docker_compose_accepts_the_files_with_the_example_env_file(
    files: tuple[str, ...], profile: str | None, tmp_path: Path
) -> None:
    compose = _docker_compose()
    env_file = tmp_path / "sluice.env"
    example = (DOCKER / "sluice.env.example").read_text()
    env_file.write_text(example + "".join(f"{k}={v}\n" for k, v in HOSTS_VARIABLES.items()))
    argv = [*compose, "--env-file", str(env_file), "--project-directory", str(DOCKER)]
    for name in files:
        argv += ["-f", str(DOCKER / name)]
    if profile:
        argv += ["--profile", profile]
    checked = subprocess.run([*argv, "config", "-q"], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
