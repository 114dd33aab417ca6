"""The environment the tests run in is the lock: every distribution installed is at a version uv.lock
holds (`make test` installs it with `uv sync --locked`), so what passed here is what CI and the
image install. And `make lock`'s report names what an upgrade moved."""

from __future__ import annotations

from importlib.metadata import distributions
from pathlib import Path

from packaging.utils import canonicalize_name

from testbed.lock_report import changes, locked_versions

ROOT = Path(__file__).resolve().parents[2]
# What `python -m venv` seeds; not the project's to lock.
SEEDED = {"pip", "setuptools", "wheel"}


def test_every_installed_distribution_is_at_a_version_the_lock_holds():
    locked = {canonicalize_name(name): versions for name, versions in
              locked_versions((ROOT / "uv.lock").read_text()).items()}
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}

    outside = {name: version for name, version in installed.items()
               if name not in SEEDED and version not in locked.get(name, set())}

    assert outside == {}, "installed but not as uv.lock holds them: run `make install` (or `make lock` to take them)"
    assert {"celery", "kombu", "redis", "mypy", "ruff"} <= installed.keys()


def test_the_lock_report_names_what_moved():
    before = {"kombu": {"5.6.0"}, "redis": {"8.1.0"}, "gone": {"1.0"}, "same": {"2.0"}}
    after = {"kombu": {"5.7.0"}, "redis": {"8.1.0"}, "new": {"0.3"}, "same": {"2.0"}}

    assert changes(before, after) == ["  - gone 1.0", "  ~ kombu 5.6.0 -> 5.7.0", "  + new 0.3"]
