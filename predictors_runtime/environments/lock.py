"""Locking an API's requirements at deploy, held to the exact versions of Sluice's own libraries.

An environment layers the project's packages over Sluice's own (`host.py`): its worker nodes and
replicas import Sluice's runtime, Celery's, Flask's and numpy's code from the same process. A
requirement that replaced one of those would break Sluice under the API, and uv resolves without
looking at what is already installed. So the deploy resolves the requirements with every
distribution Sluice depends on (`server_pins`, the closure of its requirements as installed here)
as a `==` constraint: a direct pin that disagrees is refused naming both versions, and one that
disagrees through a dependency is refused with uv's explanation, which names both as well. The
output is the lock every host installs, so all of them run the same versions.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

from packaging.markers import UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from foundation.errors import ConfigError, DependencyConflict, SluiceError
from foundation.version import sluice_version

from .project_files import DependencyFiles
from .spec import EnvironmentSpec
from .uv_tool import run_uv, tail

# Where Sluice's own requirements start when it runs from a checkout that was not installed.
SERVER_ROOTS = (
    "celery", "kombu", "redis", "flask", "gunicorn", "gevent", "pydantic", "prometheus-client", "orjson",
    "wcmatch", "pyarrow", "numpy", "click", "rich", "requests", "pyyaml", "pathspec", "python-dotenv", "uv",
    "onnxruntime", "tensorflow", "tensorflow-cpu", "boto3", "google-cloud-storage",
)


def installed_distributions() -> dict[str, metadata.Distribution]:
    """What this interpreter has installed: canonical name -> its distribution (the first on the path)."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist)
    return found


def _requirements_of(dist: metadata.Distribution, extras: set[str], any_extra: bool) -> list[Requirement]:
    kept = []
    for text in dist.requires or []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        marker = requirement.marker
        if marker is not None and not any_extra:
            try:
                if not any(marker.evaluate({"extra": extra}) for extra in extras | {""}):
                    continue
            except UndefinedEnvironmentName:
                continue
        elif marker is not None:
            try:
                if not marker.evaluate({"extra": ""}) and "extra" not in str(marker):
                    continue  # a platform or Python condition that does not hold here
            except UndefinedEnvironmentName:
                continue
        kept.append(requirement)
    return kept


def server_pins() -> dict[str, str]:
    """Every distribution Sluice runs on, as installed in this interpreter: canonical name -> version.

    The closure of the `sluice` distribution's requirements (every extra that is installed), or of
    `SERVER_ROOTS` when Sluice runs from a checkout that was not installed. Read once per process
    (it reads every installed distribution's metadata: a fifth of a second).
    """
    return dict(_server_pins())


@functools.cache
def _server_pins() -> tuple[tuple[str, str], ...]:
    installed = installed_distributions()
    pins: dict[str, str] = {}
    pending: list[tuple[str, set[str]]] = []
    own = installed.get("sluice")
    if own is not None:
        for requirement in _requirements_of(own, set(), any_extra=True):
            pending.append((canonicalize_name(requirement.name), set(requirement.extras)))
    else:
        pending.extend((name, set()) for name in SERVER_ROOTS)
    while pending:
        name, extras = pending.pop()
        dist = installed.get(name)
        if dist is None or name in pins:
            continue
        pins[name] = dist.version
        for requirement in _requirements_of(dist, extras, any_extra=False):
            pending.append((canonicalize_name(requirement.name), set(requirement.extras)))
    return tuple(sorted(pins.items()))


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_direct_pins(requirements: str, pins: dict[str, str], where: str) -> None:
    """Refuse a requirement line that names one of Sluice's libraries at a version other than the one it runs."""
    for number, raw in enumerate(requirements.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue  # uv reads it, or says what is wrong with it
        name = canonicalize_name(requirement.name)
        if name in pins and requirement.specifier and not requirement.specifier.contains(pins[name], prereleases=True):
            raise DependencyConflict(
                f"{where} line {number}: {line} conflicts with Sluice's own {requirement.name} {pins[name]}, which "
                f"its worker nodes and replicas run on: require {requirement.name}=={pins[name]} (or drop the pin)")


def index_arguments(index_url: str | None, find_links: Sequence[str], no_index: bool) -> tuple[str, ...]:
    """uv's options for where packages come from, as the settings give them."""
    args: list[str] = []
    if index_url:
        args += ["--index-url", index_url]
    for link in find_links:
        args += ["--find-links", link]
    if no_index:
        args.append("--no-index")
    return tuple(args)


# How many pins `--nearest-wheels` may move in one deploy (each move is one more resolution).
MAX_MOVES = 20
# uv's line for a requirement it had to build from source and could not.
_UNBUILT = re.compile(r"Failed to (?:download and )?build `(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^`\s]+)`")


def _unresolved(output: str, pins: dict[str, str], where: str, project_dir: Path, cache_dir: Path,
                index_args: Sequence[str]) -> SluiceError:
    """Why uv could not lock the requirements, its cause on the first line: a pin whose source did not
    build (with the oldest release that has a wheel here), a conflict with one of Sluice's own
    libraries, or uv's own words."""
    message = tail(output)
    unbuilt = _UNBUILT.search(output)
    if unbuilt is not None:  # before the pins: a failed build's output names its build tools (setuptools)
        name, version = unbuilt.group("name"), unbuilt.group("version")
        return ConfigError(f"{where} cannot be resolved: {name}=={version} has no wheel for Python {python_tag()} "
                           f"on {sysconfig.get_platform()}, and its source did not build; "
                           + nearest_wheel_hint(name, version, project_dir, cache_dir, index_args) + f"\n{message}")
    named = [name for name in pins if names_package(message, name)]
    if named:
        return DependencyConflict(f"{where} conflicts with the libraries Sluice runs on ("
                                  + ", ".join(f"{name} {pins[name]}" for name in named) + f"): {message}")
    return ConfigError(f"{where} cannot be resolved: {message}")


def oldest_release_with_a_wheel(name: str, after: str, project_dir: Path, cache_dir: Path,
                                index_args: Sequence[str]) -> str | None:
    """The oldest release of `name` after version `after` that has a wheel for this Python and
    platform, from the same index; None when no later release has one."""
    with tempfile.TemporaryDirectory(prefix="sluice-wheel-") as tmp:
        wanted = Path(tmp) / "requirement.txt"
        wanted.write_text(f"{name}>{after}\n")
        result = run_uv(["pip", "compile", str(wanted), "--python", sys.executable, "--no-header", "--no-annotate",
                         "--quiet", "--no-deps", "--resolution", "lowest-direct", "--only-binary", name,
                         *index_args], cwd=project_dir, cache_dir=cache_dir)
    if result.returncode != 0:
        return None
    for line in result.stdout.splitlines():
        listed, _, version = line.strip().partition("==")
        if version and canonicalize_name(listed) == canonicalize_name(name):
            return version.split(";")[0].strip()
    return None


def nearest_wheel_hint(name: str, version: str, project_dir: Path, cache_dir: Path, index_args: Sequence[str]) -> str:
    """What to do about a pin with no wheel here: the oldest later release that has one, if any."""
    nearest = oldest_release_with_a_wheel(name, version, project_dir, cache_dir, index_args)
    if nearest is None:
        return "no later release has a wheel for it either"
    return f"the oldest release with one is {name}=={nearest}"


def names_package(message: str, name: str) -> bool:
    """Whether an installer's message names the package `name` itself: as a whole name, not inside
    another one (`flask` is not named by `flask-cors`, nor `sluice` by `sluice-no-such-package`)."""
    pattern = re.escape(canonicalize_name(name)).replace("\\-", "[-_.]")
    return re.search(rf"(?<![\w.-]){pattern}(?![\w-]|\.\w)", message, flags=re.IGNORECASE) is not None


def lock_environment(files: DependencyFiles, project_dir: Path, *, cache_dir: Path, where: str,
                     index_args: Sequence[str] = (), deployed: Iterable[EnvironmentSpec] = (),
                     nearest_wheels: bool = False) -> EnvironmentSpec:
    """Resolve the project's requirements once, held to Sluice's own versions: the spec every host builds.

    A deployed environment (`deployed`) locked from the same requirements text, index options,
    Python, platform and Sluice libraries lends its lock instead, as a lock file kept beside the
    requirements would: a redeploy that leaves `requirements.txt` alone keeps its versions (and its
    environment on every host), and two APIs with the same requirements share one environment.
    Edit the requirements to resolve them again.

    `DependencyConflict` names both versions of a library Sluice runs on; `ConfigError` carries
    uv's message for requirements that cannot be resolved otherwise (a package or version that
    does not exist). `where` names the API in messages.

    With `nearest_wheels` (an old project on today's Python, asked for at deploy), an exact pin of a
    library Sluice runs on takes Sluice's version, and an exact pin with no wheel here whose source
    does not build moves to the oldest release that has one; each move is kept in the spec.
    """
    pins = server_pins()
    pip_where = f"{where}: {files.pip_path}"
    requirements_text, moved = files.requirements, list[str]()
    if nearest_wheels:
        requirements_text, moved = take_sluices_versions(requirements_text, pins)
    check_direct_pins(requirements_text, pins, pip_where)
    lock = ""
    same = [spec.lock for spec in deployed
            if (spec.requirements, tuple(spec.index_args), spec.server_pins, spec.python, spec.platform,
                spec.sluice_version) == (requirements_text, tuple(index_args), pins, python_tag(),
                                         sysconfig.get_platform(), sluice_version())]
    if same:
        lock = same[0]
    elif requirements_text.strip():
        while True:
            result, output = _compile(requirements_text, files, project_dir, cache_dir, pins, index_args)
            if result.returncode == 0:
                break
            unbuilt = _UNBUILT.search(output)
            if nearest_wheels and unbuilt is not None and len(moved) < MAX_MOVES:
                name, version = unbuilt.group("name"), unbuilt.group("version")
                nearest = oldest_release_with_a_wheel(name, version, project_dir, cache_dir, index_args)
                moved_text = repinned(requirements_text, name, version, nearest) if nearest else None
                if nearest is not None and moved_text is not None:
                    requirements_text = moved_text
                    moved.append(f"{name}=={version} -> {name}=={nearest}: the oldest release with a wheel "
                                 f"for Python {python_tag()} on {sysconfig.get_platform()}")
                    continue
            raise _unresolved(output, pins, pip_where, project_dir, cache_dir, index_args)
        lock = result.stdout
    return EnvironmentSpec(
        requirements=requirements_text, shell=files.shell, lock=lock, server_pins=pins, python=python_tag(),
        platform=sysconfig.get_platform(), sluice_version=sluice_version(), index_args=tuple(index_args),
        pip_path=files.pip_path, shell_path=files.shell_path, moved=tuple(moved),
    )


def _compile(requirements_text: str, files: DependencyFiles, project_dir: Path, cache_dir: Path,
             pins: dict[str, str], index_args: Sequence[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """`uv pip compile` of the requirements held to Sluice's versions; the result, and its output as
    a message reads it (the project's own paths, not the temporary ones)."""
    original = project_dir / files.pip_path  # its own `-r`/`-c` lines are relative to it
    with tempfile.TemporaryDirectory(prefix="sluice-lock-") as tmp:
        constraints = Path(tmp) / "sluice-server.txt"
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
        requirements = original
        if original.is_file() and requirements_text != original.read_text():  # pins moved: beside the original
            requirements = original.with_name(f".sluice-moved-{original.name}")
            requirements.write_text(requirements_text)
        result = run_uv(
            ["pip", "compile", str(requirements), "--constraint", str(constraints), "--python", sys.executable,
             "--no-header", "--no-annotate", "--quiet", "--emit-index-url", "--emit-find-links", *index_args],
            cwd=project_dir, cache_dir=cache_dir,
        )
        output = (result.stderr or result.stdout).replace(str(requirements), files.pip_path)
        output = output.replace(str(original), files.pip_path).replace(str(constraints), "Sluice's server libraries")
    return result, output


def take_sluices_versions(requirements_text: str, pins: dict[str, str]) -> tuple[str, list[str]]:
    """The requirements with each pin of a library Sluice runs on, at a version other than Sluice's, taking
    Sluice's version: the line goes, as every environment sees Sluice's own libraries (after its own
    packages, `host.py`) and the lock is held to their versions; the moves, each `old -> new: why`."""
    lines, moved = [], []
    for raw in requirements_text.splitlines():
        requirement = _requirement_of(raw)
        name = canonicalize_name(requirement.name) if requirement is not None else ""
        if requirement is not None and name in pins and requirement.specifier and \
                not requirement.specifier.contains(pins[name], prereleases=True):
            moved.append(f"{requirement!s} -> {_with_version(requirement, pins[name])}: Sluice's own "
                         f"{requirement.name}, which its nodes and replicas run on")
        else:
            lines.append(raw)
    return "\n".join(lines) + "\n", moved


def repinned(requirements_text: str, name: str, version: str, new_version: str) -> str | None:
    """The requirements with the direct pin `name==version` moved to `new_version`; None when no line
    pins it (a dependency of another requirement: not a pin a deploy moves)."""
    lines, found = [], False
    for raw in requirements_text.splitlines():
        requirement = _requirement_of(raw)
        if requirement is not None and canonicalize_name(requirement.name) == canonicalize_name(name) and \
                str(requirement.specifier) == f"=={version}":
            lines.append(_with_version(requirement, new_version))
            found = True
        else:
            lines.append(raw)
    return "\n".join(lines) + "\n" if found else None


def _requirement_of(raw: str) -> Requirement | None:
    line = raw.split(" #", 1)[0].strip()
    if not line or line.startswith(("#", "-")):
        return None
    try:
        return Requirement(line)
    except InvalidRequirement:
        return None


def _with_version(requirement: Requirement, version: str) -> str:
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    marker = f"; {requirement.marker}" if requirement.marker else ""
    return f"{requirement.name}{extras}=={version}{marker}"


