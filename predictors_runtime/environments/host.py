"""A host's environments: each API environment built once, under its key, and reused by every process.

Layout under `<cache_dir>/environments/`:

- `<key>/`: a finished environment, a virtual environment whose `site-packages` holds the
  project's packages and a `.pth` file that adds Sluice's own site folders after them, so the
  API's packages win and Sluice's runtime, Celery and Flask are still importable. Only packages
  that Sluice's interpreter does not already have at the locked version are installed.
- `.build-<key>-<pid>/`: a build in progress. Nothing ever uses it: a build is made here, checked
  (the predictor's top-level imports resolve, Sluice's libraries are the locked versions), given
  its marker file, and only then renamed to `<key>/`. A build killed half-way leaves a folder
  with no marker under a name no reader looks at; the next build of the key removes it.
- `.locks/<key>.build`: held exclusively while the key is built (two processes that want the
  same new environment build it once: the second waits, looks again and finds it built) or removed.
- `.locks/<key>.use`: held shared by every process that runs in the environment; pruning removes
  only environments whose use lock it can take exclusively.
- `.uv-cache/`: uv's cache, on the same filesystem, so installs hard-link from it.

Building runs `dependencies.sh` with `bash -e` first (with the environment's `VIRTUAL_ENV` and
`PATH`), then installs the lock with `uv pip install --no-deps`. What `dependencies.sh` changes
outside the environment (an `apt-get install`) changes the host, for every API on it.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import logging
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from foundation.errors import EnvironmentBuildFailed

from ..config import ApiConfig
from .lock import installed_distributions, server_pins
from .spec import EnvironmentSpec, lock_lines, option_lines, pinned
from .uv_tool import run_uv, tail, uv_binary

log = logging.getLogger(__name__)

MARKER = ".sluice-environment.json"
USED = ".sluice-used"
BASE_PTH = "_sluice_base.pth"
SHELL_TIMEOUT_S = 1800.0
# How long an environment no deployed API uses is kept before `prune` removes it.
DEFAULT_PRUNE_GRACE_S = 3600.0

_CHECK = r"""
import importlib.metadata, importlib.util, json, sys
args = json.loads(sys.argv[1])
sys.path[:0] = args["paths"]
missing = []
for name in args["modules"]:
    try:
        if importlib.util.find_spec(name) is None:
            missing.append(name)
    except (ImportError, ValueError):
        missing.append(name)
wrong = {}
for name, version in args["pins"].items():
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        continue
    if found != version:
        wrong[name] = found
print(json.dumps({"missing": missing, "wrong": wrong}))
"""


class BuildEvents(Protocol):
    """Told what happens to environments on this host (the figures in `/metrics`, the states `sluice get` shows)."""

    def building(self, key: str) -> None: ...

    def built(self, key: str, seconds: float) -> None: ...

    def reused(self, key: str) -> None: ...

    def failed(self, key: str, message: str) -> None: ...


@dataclass(frozen=True)
class Environment:
    """A finished environment on this host."""

    key: str
    path: Path
    info: dict[str, Any]

    @property
    def python(self) -> Path:
        """Its interpreter: start a process with it and the process runs in the environment."""
        return self.path / "bin" / "python"


@dataclass(frozen=True)
class EnvironmentEntry:
    """One folder under the environments root, as `sluice env ls` lists it."""

    key: str
    complete: bool
    size_bytes: int
    built_at: float | None
    last_used: float | None
    in_use: bool
    packages: dict[str, str]


def base_site_folders() -> list[str]:
    """Sluice's own site folders, which every environment adds after its own."""
    folders = [p for p in site.getsitepackages() if os.path.isdir(p)]
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        folders.append(site.getusersitepackages())
    return folders


def top_level_imports(source: str) -> list[str]:
    """The absolute modules a predictor imports unconditionally at its top level (their first part)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the import of the predictor says so, with the line
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return [n for n in dict.fromkeys(names) if n != "__future__"]


def _folder_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


class HostEnvironments:
    """The environments of this host, under `root`."""

    def __init__(self, root: Path, *, events: BuildEvents | None = None,
                 base_folders: Sequence[str] | None = None) -> None:
        self.root = Path(root).expanduser()
        self._events = events
        self._base_folders = list(base_site_folders() if base_folders is None else base_folders)

    @classmethod
    def under(cls, cache_dir: str | Path, events: BuildEvents | None = None) -> HostEnvironments:
        """The environments of a host whose cache folder is `cache_dir` (`SLUICE_CACHE_DIR`)."""
        return cls(Path(cache_dir).expanduser() / "environments", events=events)

    @property
    def uv_cache(self) -> Path:
        return self.root / ".uv-cache"

    def _lock_path(self, name: str) -> Path:
        folder = self.root / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / name

    @contextlib.contextmanager
    def _flock(self, name: str, mode: int) -> Iterator[bool]:
        """Hold a lock file; yields False when a non-blocking lock could not be taken."""
        fd = os.open(self._lock_path(name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    # -- reading ------------------------------------------------------------------------------
    def get(self, key: str) -> Environment | None:
        """The finished environment of `key` on this host, None when it is not built (or not finished)."""
        folder = self.root / key
        try:
            info = json.loads((folder / MARKER).read_text())
        except (OSError, ValueError):
            return None
        return Environment(key, folder, info)

    def hold(self, key: str) -> int:
        """Mark the environment in use until the returned descriptor is closed (pruning leaves it alone)."""
        fd = os.open(self._lock_path(f"{key}.use"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            (self.root / key / USED).touch()
        return fd

    def entries(self) -> list[EnvironmentEntry]:
        """Every environment folder on this host, finished or not, by key."""
        found = []
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name) if self.root.is_dir() else []:
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            environment = self.get(entry.name)
            info = environment.info if environment is not None else {}
            used = self.root / entry.name / USED
            with self._flock(f"{entry.name}.use", fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
                in_use = not free
            found.append(EnvironmentEntry(
                entry.name, environment is not None, _folder_size(Path(entry.path)), info.get("built_at"),
                used.stat().st_mtime if used.exists() else info.get("built_at"), in_use,
                dict(info.get("packages") or {})))
        return found

    # -- building -----------------------------------------------------------------------------
    def ensure(self, spec: EnvironmentSpec, project_dir: Path, *, python_paths: Sequence[Path] = (),
               predictor_path: str | None = None, progress: Callable[[str], None] | None = None) -> Environment:
        """The environment of `spec`, built here first if this host does not have it yet.

        `project_dir` is the API's unpacked project (`dependencies.sh` runs in it, relative index
        paths are read from it); `predictor_path` names the file whose top-level imports must
        resolve in the result. `EnvironmentBuildFailed` carries what failed, in the installer's words.
        """
        found = self._reuse(spec.key)
        if found is not None:
            return found
        self.root.mkdir(parents=True, exist_ok=True)
        with self._flock("cache", fcntl.LOCK_SH), self._flock(f"{spec.key}.build", fcntl.LOCK_EX):
            found = self._reuse(spec.key)  # built by another process while this one waited
            if found is not None:
                return found
            if self._events is not None:
                self._events.building(spec.key)
            started = time.monotonic()
            try:
                environment = self._build(spec, Path(project_dir), list(python_paths), predictor_path, progress)
            except EnvironmentBuildFailed as e:
                if self._events is not None:
                    self._events.failed(spec.key, e.message)
                raise
            seconds = time.monotonic() - started
            log.info("environment %s built in %.2f s", spec.key, seconds, extra={"environment": spec.key})
            if self._events is not None:
                self._events.built(spec.key, seconds)
            return environment

    def ensure_for(self, spec: EnvironmentSpec, project_dir: Path, api: ApiConfig,
                   progress: Callable[[str], None] | None = None) -> Environment:
        """`ensure` for an API: its `python_path` is searched and its predictor's imports checked."""
        python_path = api.predictor.python_path
        return self.ensure(spec, project_dir, python_paths=[project_dir / python_path] if python_path else [],
                           predictor_path=api.predictor.path, progress=progress)

    def _reuse(self, key: str) -> Environment | None:
        """The finished environment of `key`, marked used (and counted as reused), or None."""
        found = self.get(key)
        if found is None:
            return None
        with contextlib.suppress(OSError):
            (found.path / USED).touch()
        if self._events is not None:
            self._events.reused(key)
        return found

    def _clear_leftovers(self, key: str) -> None:
        """Under the key's build lock: what killed builds of it left, and a folder without a marker."""
        for entry in os.scandir(self.root):
            if entry.name.startswith(f".build-{key}-"):
                shutil.rmtree(entry.path, ignore_errors=True)
        folder = self.root / key
        if folder.exists() and not (folder / MARKER).exists():
            shutil.rmtree(folder, ignore_errors=True)

    def _build(self, spec: EnvironmentSpec, project_dir: Path, python_paths: list[Path], predictor_path: str | None,
               progress: Callable[[str], None] | None) -> Environment:
        say = progress or (lambda _message: None)
        self._check_host(spec)
        self._clear_leftovers(spec.key)
        staging = self.root / f".build-{spec.key}-{os.getpid()}"
        started = time.time()
        try:
            say("creating the virtual environment")
            self._uv(["venv", "--relocatable", "--quiet", "--python", sys.executable, str(staging)], project_dir,
                     "creating the environment")
            site_folder = self._site_folder(staging)
            (site_folder / BASE_PTH).write_text(
                "".join(f"import site; site.addsitedir({folder!r})\n" for folder in self._base_folders))
            if spec.shell.strip():
                say(f"running {spec.shell_path}")
                self._run_shell(spec, staging, project_dir)
            installed = self._install(spec, staging, project_dir, say)
            say("checking the environment")
            self._check(spec, staging, project_dir, python_paths, predictor_path)
            info = {"key": spec.key, "built_at": time.time(), "seconds": round(time.time() - started, 3),
                    "packages": spec.resolved(), "installed": installed, "python": spec.python}
            (staging / MARKER).write_text(json.dumps(info, indent=2))
            os.rename(staging, self.root / spec.key)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        found = self.get(spec.key)
        if found is None:  # pragma: no cover - renamed just above, under the build lock
            raise EnvironmentBuildFailed(f"environment {spec.key} vanished after it was built")
        return found

    def _check_host(self, spec: EnvironmentSpec) -> None:
        """This host must run what the lock was made for: the Python version and Sluice's own libraries."""
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if here != spec.python:
            raise EnvironmentBuildFailed(f"this host runs Python {here}, the environment was locked for {spec.python}: "
                                         "deploy again from a Sluice on the same Python")
        pins = server_pins()
        differ = [f"{name} {pins.get(name, 'not installed')} (locked against {version})"
                  for name, version in spec.server_pins.items() if pins.get(name, version) != version]
        if differ:
            raise EnvironmentBuildFailed("this host's Sluice libraries differ from those the environment was locked "
                                         f"against: {', '.join(differ[:5])}: run one Sluice version everywhere, "
                                         "then deploy again")

    @staticmethod
    def _site_folder(prefix: Path) -> Path:
        found = sorted(prefix.glob("lib/python*/site-packages"))
        if not found:
            raise EnvironmentBuildFailed(f"the new environment has no site-packages folder under {prefix / 'lib'}")
        return found[0]

    def _uv(self, args: list[str], cwd: Path, doing: str) -> str:
        result = run_uv(args, cwd=cwd, cache_dir=self.uv_cache)
        if result.returncode != 0:
            raise EnvironmentBuildFailed(f"{doing} failed: {tail(result.stderr or result.stdout)}")
        return result.stdout

    def _run_shell(self, spec: EnvironmentSpec, staging: Path, project_dir: Path) -> None:
        script = staging / ".sluice-dependencies.sh"
        script.write_text(spec.shell)
        env = dict(os.environ)
        env["VIRTUAL_ENV"] = str(staging)
        env["PATH"] = os.pathsep.join([str(staging / "bin"), str(Path(uv_binary()).parent), env.get("PATH", "")])
        env.pop("PYTHONHOME", None)
        try:
            result = subprocess.run(["bash", "-e", str(script)], cwd=project_dir, env=env, capture_output=True,
                                    text=True, timeout=SHELL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise EnvironmentBuildFailed(f"{spec.shell_path} did not finish within {SHELL_TIMEOUT_S:.0f} s") from e
        except OSError as e:
            raise EnvironmentBuildFailed(f"{spec.shell_path} could not be run with bash: {e}") from e
        for line in (result.stdout + result.stderr).strip().splitlines()[-50:]:
            log.info("%s: %s", spec.shell_path, line, extra={"environment": spec.key})
        if result.returncode != 0:
            raise EnvironmentBuildFailed(f"{spec.shell_path} exited with status {result.returncode}: "
                                         f"{tail(result.stderr or result.stdout)}")

    def _install(self, spec: EnvironmentSpec, staging: Path, project_dir: Path,
                 say: Callable[[str], None]) -> dict[str, str]:
        """Install what the lock pins and Sluice's interpreter does not already have at that version."""
        have = {name: dist.version for name, dist in installed_distributions().items()}
        wanted = []
        installed: dict[str, str] = {}
        for line in lock_lines(spec.lock):
            name, version = pinned(line)
            if name and have.get(name) == version:
                continue  # Sluice's copy is the one locked: the environment sees it through the .pth
            wanted.append(line)
            if name:
                installed[name] = version
        if not wanted:
            return installed
        say(f"installing {len(wanted)} package{'s' if len(wanted) != 1 else ''} from {spec.pip_path}")
        requirements = staging / ".sluice-install.txt"
        requirements.write_text("\n".join([*option_lines(spec.lock), *wanted]) + "\n")
        self._uv(["pip", "install", "--python", str(staging / "bin" / "python"), "--no-deps", "--link-mode",
                  "hardlink", "--quiet", "-r", str(requirements), *spec.index_args], project_dir,
                 f"installing {spec.pip_path}")
        return installed

    def _check(self, spec: EnvironmentSpec, staging: Path, project_dir: Path, python_paths: list[Path],
               predictor_path: str | None) -> None:
        modules: list[str] = []
        if predictor_path and (project_dir / predictor_path).is_file():
            modules = top_level_imports((project_dir / predictor_path).read_text(encoding="utf-8", errors="replace"))
        paths = [str(p) for p in [*python_paths, project_dir]]
        argument = json.dumps({"modules": modules, "paths": paths, "pins": spec.server_pins})
        try:
            result = subprocess.run([str(staging / "bin" / "python"), "-c", _CHECK, argument], cwd=project_dir,
                                    capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EnvironmentBuildFailed(f"the new environment's interpreter could not be run: {e}") from e
        if result.returncode != 0:
            raise EnvironmentBuildFailed(f"the new environment's interpreter failed: {tail(result.stderr)}")
        found = json.loads(result.stdout.strip().splitlines()[-1])
        if found["wrong"]:
            wrong = ", ".join(f"{name} {version} (Sluice runs {spec.server_pins[name]})"
                              for name, version in sorted(found["wrong"].items()))
            raise EnvironmentBuildFailed(f"the environment replaces libraries Sluice runs on: {wrong}; "
                                         f"{spec.shell_path} must not install them")
        if found["missing"]:
            missing = ", ".join(found["missing"])
            raise EnvironmentBuildFailed(f"{predictor_path} imports {missing}, which neither the environment nor the "
                                         f"project provides: add {'it' if len(found['missing']) == 1 else 'them'} "
                                         f"to {spec.pip_path}")

    # -- removing -----------------------------------------------------------------------------
    def prune(self, keep: set[str], now: float, grace_s: float = DEFAULT_PRUNE_GRACE_S) -> list[str]:
        """Remove the environments not in `keep` unused for `grace_s`, and prune uv's cache; returns their keys.

        One in use (a process holds its use lock) or being built is left alone.
        """
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for entry in self.entries():
            if entry.key in keep or entry.in_use:
                continue
            last = entry.last_used if entry.last_used is not None else 0.0
            if entry.complete and now - last < grace_s:
                continue
            with self._flock(f"{entry.key}.build", fcntl.LOCK_EX | fcntl.LOCK_NB) as building_free, \
                    self._flock(f"{entry.key}.use", fcntl.LOCK_EX | fcntl.LOCK_NB) as use_free:
                if not (building_free and use_free):
                    continue
                trash = self.root / f".trash-{entry.key}-{os.getpid()}"
                try:
                    os.rename(self.root / entry.key, trash)
                except OSError:
                    continue
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(entry.key)
            log.info("environment %s removed: no deployed api uses it", entry.key, extra={"environment": entry.key})
        for leftover in os.scandir(self.root):
            if leftover.name.startswith(".trash-"):
                shutil.rmtree(leftover.path, ignore_errors=True)
        with self._flock("cache", fcntl.LOCK_EX | fcntl.LOCK_NB) as cache_free:
            if cache_free and self.uv_cache.is_dir():
                run_uv(["cache", "prune", "--quiet"], cwd=self.root, cache_dir=self.uv_cache)
        return removed
