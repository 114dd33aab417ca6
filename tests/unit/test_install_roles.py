"""Dependencies by role: a client-only install works, and each extra brings what its role imports.

`pip install sluice` must give a working `sluice` command and Python client without the server,
the model runtimes or the cloud storage clients; the extras of pyproject.toml bring those. Here: what
each role declares. A client-only install simulated in a fresh interpreter (imports of every
package outside the client's dependencies fail, as they would where the package is not
installed) is in tests/integration/test_install_roles_interpreters.py.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

# Distributions no client-only install may pull in, directly or through another one.
HEAVY_DISTRIBUTIONS = {"onnxruntime", "tensorflow", "tensorflow-cpu", "pyarrow", "pandas", "gevent", "boto3",
                       "botocore", "google-cloud-storage", "celery", "kombu", "flask", "gunicorn", "numpy"}


def test_a_missing_module_of_sluice_itself_is_not_blamed_on_an_extra():
    from predictors_runtime.extras import needs_extra

    with pytest.raises(ModuleNotFoundError, match="predictors_runtime.no_such_module"), needs_extra("server", "this"):
        import predictors_runtime.no_such_module  # noqa: F401


# -- the declared dependencies -------------------------------------------------------------------
def declared() -> tuple[list[Requirement], dict[str, list[Requirement]]]:
    """sluice's install_requires and its extras, from the installed (editable) distribution's metadata."""
    base: list[Requirement] = []
    extras: dict[str, list[Requirement]] = {}
    for line in requires("sluice") or []:
        requirement = Requirement(line)
        marker = str(requirement.marker or "")
        found = re.search(r'extra == "([^"]+)"', marker)
        if found:
            extras.setdefault(found.group(1), []).append(requirement)
        else:
            base.append(requirement)
    return base, extras


def names(requirements: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements}


def closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution `requirements` install, through their own dependencies (as installed here)."""
    seen: set[str] = set()
    todo: list[tuple[Requirement, set[str]]] = [(r, set()) for r in requirements]  # (requirement, its parent's extras)
    while todo:
        requirement, wanted = todo.pop()
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in (wanted or {""})):
            continue
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            lines = distribution(name).requires or []
        except PackageNotFoundError:  # not installed here: its own dependencies cannot be followed
            continue
        todo.extend((Requirement(line), set(requirement.extras)) for line in lines)
    return seen


def test_a_client_only_install_brings_none_of_the_heavy_packages():
    base, _ = declared()

    assert names(base) == {"click", "rich", "requests", "pyyaml", "pathspec", "python-dotenv"}
    pulled = closure(base)
    assert not pulled & HEAVY_DISTRIBUTIONS, pulled & HEAVY_DISTRIBUTIONS


def test_each_extra_brings_its_role_and_all_brings_every_cpu_role():
    _, extras = declared()
    by_extra = {extra: names(requirements) for extra, requirements in extras.items()}

    assert {"celery", "kombu", "redis", "flask", "gunicorn", "gevent", "pydantic", "prometheus-client", "pyarrow",
            "orjson", "wcmatch", "numpy"} <= by_extra["server"]
    assert not by_extra["server"] & {"onnxruntime", "tensorflow", "tensorflow-cpu", "boto3", "google-cloud-storage"}
    assert by_extra["onnx"] == {"onnxruntime"}
    assert by_extra["tensorflow"] == {"tensorflow"}
    assert by_extra["tensorflow-cpu"] == {"tensorflow-cpu"}
    assert by_extra["s3"] == {"boto3"}
    assert by_extra["gcs"] == {"google-cloud-storage"}
    assert by_extra["kubernetes"] == {"lightkube"}
    assert by_extra["grpc"] == {"grpcio", "grpcio-tools"}
    # `all` is Sluice itself with every CPU role's extra (one list of each role's packages).
    [itself] = extras["all"]
    assert canonicalize_name(itself.name) == "sluice"
    assert itself.extras == {"server", "onnx", "tensorflow-cpu", "s3", "gcs", "kubernetes", "grpc"}
    everything = set().union(*by_extra.values())
    assert not everything & {"pandas", "pysimdjson"}  # pyarrow writes CSV; orjson is the one JSON parser


def test_no_dependency_group_names_a_second_json_parser():
    # pandas may appear among the test tools (mlflow.sklearn imports it); Sluice itself never needs
    # it, which the extras test above holds.
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert {"examples", "dev", "bench"} <= set(groups)
    for name, entries in groups.items():
        names_in_group = {canonicalize_name(Requirement(entry).name) for entry in entries if isinstance(entry, str)}
        assert names_in_group, name
        assert "pysimdjson" not in names_in_group, name
    assert {"include-group": "examples"} in groups["dev"]


def test_the_image_installs_the_server_onnx_storage_kubernetes_and_grpc_extras_from_the_lock():
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()

    [extras] = re.findall(r'^ARG EXTRAS="([a-z0-9,-]+)"', dockerfile, re.MULTILINE)
    assert set(extras.split(",")) == {"server", "onnx", "s3", "gcs", "kubernetes", "grpc"}
    syncs = re.findall(r"uv sync ([^\n]*)", dockerfile)
    assert len(syncs) == 2 and all("--locked" in sync and "$EXTRAS" in sync for sync in syncs)
    assert not re.search(r"\bpip install [^\n]*\.\[", dockerfile)  # no extras installed from fresh ranges


