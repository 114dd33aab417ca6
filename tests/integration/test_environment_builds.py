"""Building one host's environments under concurrency and faults, with real uv and real processes.

Each test locks a small project against the tests' wheelhouse and builds it with `HostEnvironments`
in processes of its own, as two worker nodes or a node and a replica launcher on one host would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from predictors_runtime.environments import DependencyFiles, EnvironmentSpec, HostEnvironments, lock_environment
from predictors_runtime.environments.lock import index_arguments
from testbed.wheels import GREETING, GREETING_MODULE

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Builds the environment the spec file describes, in this process, and prints its folder.
BUILD = """
import json, sys
from pathlib import Path
from predictors_runtime.environments import EnvironmentSpec, HostEnvironments
spec = EnvironmentSpec.from_dict(json.loads(Path(sys.argv[2]).read_text()))
built = HostEnvironments(Path(sys.argv[1])).ensure(spec, Path(sys.argv[3]), predictor_path="predictor.py")
print(built.path)
"""


def locked(project: Path, wheelhouse: Path, shell: str, version: str = "1.0.0") -> EnvironmentSpec:
    project.mkdir(parents=True, exist_ok=True)
    (project / "predictor.py").write_text(f"import {GREETING_MODULE}\n")
    (project / "requirements.txt").write_text(f"{GREETING}=={version}\n")
    files = DependencyFiles((project / "requirements.txt").read_text(), shell)
    return lock_environment(files, project, cache_dir=project / ".uv-cache", where="test",
                            index_args=index_arguments(None, [str(wheelhouse)], True))


def start_build(root: Path, spec: EnvironmentSpec, project: Path) -> subprocess.Popen[str]:
    spec_file = project / f"spec-{spec.key}.json"
    spec_file.write_text(json.dumps(spec.to_dict()))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", BUILD, str(root), str(spec_file), str(project)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_two_processes_wanting_one_new_environment_build_it_once(tmp_path: Path, wheelhouse: Path) -> None:
    runs = tmp_path / "runs"
    spec = locked(tmp_path / "project", wheelhouse, f"echo run >> {runs}\nsleep 1\n")
    builds = [start_build(tmp_path / "envs", spec, tmp_path / "project") for _ in range(2)]
    outputs = [process.communicate(timeout=120) for process in builds]
    assert [process.returncode for process in builds] == [0, 0], outputs
    assert {out.strip() for out, _ in outputs} == {str(tmp_path / "envs" / spec.key)}
    assert runs.read_text().splitlines() == ["run"]  # dependencies.sh ran once: one build, one reuse


def test_a_build_killed_half_way_is_never_used_and_the_next_one_builds_it_anew(tmp_path: Path,
                                                                                wheelhouse: Path) -> None:
    runs, slow, started = tmp_path / "runs", tmp_path / "slow", tmp_path / "started"
    slow.touch()
    shell = f"echo run >> {runs}\ntouch {started}\nif [ -f {slow} ]; then sleep 60; fi\n"
    spec = locked(tmp_path / "project", wheelhouse, shell)
    envs = HostEnvironments(tmp_path / "envs")
    killed = start_build(envs.root, spec, tmp_path / "project")
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline and killed.poll() is None, killed.communicate()
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)  # the build and its dependencies.sh, as the OOM killer would
    killed.wait()
    assert envs.get(spec.key) is None  # half-built: not an environment
    assert [p.name for p in envs.root.iterdir() if p.name.startswith(".build-")]  # what it left
    slow.unlink()
    built = envs.ensure(spec, tmp_path / "project", predictor_path="predictor.py")
    assert built.path == envs.root / spec.key
    assert runs.read_text().splitlines() == ["run", "run"]
    assert not [p.name for p in envs.root.iterdir() if p.name.startswith(".build-")]
    answer = subprocess.run([str(built.python), "-c", f"import {GREETING_MODULE}; print({GREETING_MODULE}.VERSION)"],
                            capture_output=True, text=True, check=True)
    assert answer.stdout.strip() == "1.0.0"


def test_pruning_removes_environments_no_api_uses_after_their_grace_but_never_one_in_use(
        tmp_path: Path, wheelhouse: Path) -> None:
    envs = HostEnvironments(tmp_path / "envs")
    old = locked(tmp_path / "old", wheelhouse, "", "1.0.0")
    new = locked(tmp_path / "new", wheelhouse, "", "2.0.0")
    held = locked(tmp_path / "held", wheelhouse, "true\n", "1.0.0")
    for spec, folder in ((old, "old"), (new, "new"), (held, "held")):
        envs.ensure(spec, tmp_path / folder, predictor_path="predictor.py")
    in_use = envs.hold(held.key)
    now = time.time()
    assert envs.prune(keep={new.key}, now=now, grace_s=3600) == []  # within the grace: kept
    assert envs.prune(keep={new.key}, now=now + 7200, grace_s=3600) == [old.key]
    assert sorted(e.key for e in envs.entries()) == sorted([new.key, held.key])
    os.close(in_use)
    assert envs.prune(keep={new.key}, now=now + 7200, grace_s=3600) == [held.key]
    assert [e.key for e in envs.entries()] == [new.key]
    assert envs.get(new.key) is not None
