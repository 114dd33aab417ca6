"""Per-API environments, the parts that need no installer: what decides a key, what a deploy refuses,
which files a project brings, and what a predictor's imports are."""

from __future__ import annotations

import sys
import types
from importlib import metadata
from pathlib import Path

import pytest

from foundation.errors import ConfigError, DependencyConflict
from foundation.memory import MemoryApiRegistry
from jobs.batch.job import Job, JobStatus
from jobs.store.memory import MemoryJobStore
from predictors_runtime.config import parse_api_configs
from predictors_runtime.environments import EnvironmentSpec, read_dependency_files, server_pins
from predictors_runtime.environments.host import top_level_imports
from predictors_runtime.environments.lock import check_direct_pins, index_arguments
from predictors_runtime.loader import error_text, one_line
from predictors_runtime.namespace import ApiNamespace
from sluice.environment_upkeep import keys_in_use


def spec(**changes: object) -> EnvironmentSpec:
    fields: dict[str, object] = {
        "requirements": "humanize==4.9.0\n", "shell": "", "lock": "--find-links /w\nhumanize==4.9.0\n",
        "server_pins": {"celery": "5.7.0"}, "python": "3.11", "platform": "linux-x86_64", "sluice_version": "0.1.0"}
    fields.update(changes)
    return EnvironmentSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("change", [
    {"requirements": "humanize==4.8.0\n"}, {"shell": "apt-get install -y libgomp1\n"},
    {"lock": "humanize==4.8.0\n"}, {"server_pins": {"celery": "5.6.0"}}, {"python": "3.12"},
    {"platform": "linux-aarch64"}, {"sluice_version": "0.2.0"}, {"index_args": ("--no-index",)},
])
def test_every_input_that_decides_an_environments_content_changes_its_key(change: dict[str, object]) -> None:
    assert spec(**change).key != spec().key


def test_the_key_is_the_same_for_the_same_inputs_and_survives_being_stored() -> None:
    stored = spec().to_dict()
    assert EnvironmentSpec.from_dict(stored) == spec()
    assert EnvironmentSpec.from_dict(stored).key == spec().key == spec(pip_path="other.txt").key
    assert len(spec().key) == 16


def test_the_versions_an_environment_resolved_are_read_from_its_lock() -> None:
    locked = spec(lock="--index-url https://example/simple\n\n# a comment\nhumanize==4.9.0\nSix==1.16.0\n"
                       "pkg @ https://example/pkg.whl\n")
    assert locked.resolved() == {"humanize": "4.9.0", "six": "1.16.0"}


def test_a_direct_pin_of_a_library_sluice_runs_on_is_refused_naming_both_versions() -> None:
    with pytest.raises(DependencyConflict) as refused:
        check_direct_pins("pandas\nCelery==4.4.7  # old\n", {"celery": "5.7.0"}, "cortex.yaml: api x: requirements.txt")
    assert refused.value.message.startswith("cortex.yaml: api x: requirements.txt line 2: Celery==4.4.7 conflicts "
                                            "with Sluice's own Celery 5.7.0")


def test_a_pin_sluices_version_satisfies_and_option_lines_pass() -> None:
    requirements = "--find-links ./wheels\n-r more.txt\ncelery>=5\ncelery==5.7.0\nhumanize\n"
    check_direct_pins(requirements, {"celery": "5.7.0"}, "x")


def test_sluices_own_libraries_are_pinned_at_the_versions_installed_here() -> None:
    pins = server_pins()
    for name in ("celery", "kombu", "redis", "flask", "gunicorn", "numpy", "pydantic"):
        assert pins[name] == metadata.version(name)
    assert "pytest" not in pins  # a test tool is not what Sluice runs on


def test_index_options_become_uvs() -> None:
    assert index_arguments("https://pypi.example/simple", ["/wheels", "https://files"], True) == (
        "--index-url", "https://pypi.example/simple", "--find-links", "/wheels", "--find-links", "https://files",
        "--no-index")
    assert index_arguments(None, [], False) == ()


def test_a_predictors_unconditional_top_level_imports_are_what_a_build_checks() -> None:
    source = ("from __future__ import annotations\nimport os, numpy.linalg\nfrom humanize import naturalsize\n"
              "from . import sibling\ntry:\n    import optional_thing\nexcept ImportError:\n    pass\n"
              "def f():\n    import lazy\n")
    assert top_level_imports(source) == ["os", "numpy", "humanize"]
    assert top_level_imports("def broken(:\n") == []


def api(predictor: str = "{type: python, path: predictor.py}", name: str = "x"):
    [config] = parse_api_configs(f"- name: {name}\n  kind: BatchAPI\n  predictor: {predictor}\n")
    return config


def test_a_projects_dependency_files_are_read_from_where_its_config_says(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("humanize\n")
    (tmp_path / "dependencies.sh").write_text("echo hi\n")
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "pip.txt").write_text("six\n")
    files = read_dependency_files(tmp_path, api())
    assert (files.requirements, files.shell, files.empty) == ("humanize\n", "echo hi\n", False)
    moved = read_dependency_files(
        tmp_path, api("{path: predictor.py, dependencies: {pip: deps/pip.txt, shell: none.sh}}"))
    assert (moved.requirements, moved.shell, moved.pip_path) == ("six\n", "", "deps/pip.txt")


def test_a_project_without_dependency_files_has_nothing_to_install(tmp_path: Path) -> None:
    assert read_dependency_files(tmp_path, api()).empty
    (tmp_path / "requirements.txt").write_text("# nothing yet\n\n")
    (tmp_path / "dependencies.sh").write_text("#!/bin/bash\n")
    assert read_dependency_files(tmp_path, api()).empty  # comments only: nothing to install


def test_conda_packages_are_refused_with_what_to_do_instead(tmp_path: Path) -> None:
    (tmp_path / "conda-packages.txt").write_text("conda-forge::rdkit\n")
    with pytest.raises(ConfigError) as refused:
        read_dependency_files(tmp_path, api(), "cortex.yaml")
    assert "predictor.dependencies.conda: conda-packages.txt" in refused.value.message
    assert "requirements.txt" in refused.value.message


def test_a_project_module_wins_over_an_outside_module_of_the_same_name_only_while_its_namespace_is_in_place(
        tmp_path: Path) -> None:
    (tmp_path / "sluice_test_shadowed.py").write_text("WHOSE = 'the project'\n")
    outside = types.ModuleType("sluice_test_shadowed")
    outside.WHOSE = "sluice"  # type: ignore[attr-defined]
    sys.modules["sluice_test_shadowed"] = outside
    namespace = ApiNamespace(tmp_path, {})
    try:
        with namespace.active():
            import sluice_test_shadowed  # type: ignore[import-not-found]

            assert sluice_test_shadowed.WHOSE == "the project"
        assert sys.modules["sluice_test_shadowed"] is outside
        with namespace.active():
            assert sys.modules["sluice_test_shadowed"].WHOSE == "the project"  # its own, kept between calls
        assert sys.modules["sluice_test_shadowed"] is outside
    finally:
        namespace.close()
        sys.modules.pop("sluice_test_shadowed", None)


def test_a_failure_for_a_caller_is_one_line_and_an_error_from_another_process_keeps_its_traceback() -> None:
    assert one_line("importing p.py failed: Traceback (most recent call last):\n  File \"/srv/p.py\"\n"
                    "ValueError: bad") == "importing p.py failed: ValueError: bad"
    error = ValueError("x")
    error.remote_text = "Traceback (most recent call last):\nValueError: x (raised in the environment)"  # type: ignore[attr-defined]
    assert error_text(error).endswith("(raised in the environment)")


def job(job_id: str, environment: dict[str, object] | None) -> Job:
    return Job(job_id=job_id, api_name="a", workers=1, config={}, timeout=None, total_batch_count=1, start_time=1.0,
               environment=environment)


def test_the_environments_kept_are_those_of_deployed_apis_and_of_active_jobs() -> None:
    registry = MemoryApiRegistry()
    for name in ("with", "without"):
        registry.put(api(name=name), "b" * 64, environment={"key": "deployed"} if name == "with" else None)
    store = MemoryJobStore()
    store.create(job("running", {"key": "of-a-running-job"}), JobStatus.RUNNING)
    store.create(job("ended", {"key": "of-an-ended-job"}), JobStatus.RUNNING)
    store.transition("ended", JobStatus.SUCCEEDED)
    assert keys_in_use(registry.all(), store) == {"deployed", "of-a-running-job"}


def test_a_deploy_with_the_requirements_of_a_deployed_environment_reuses_its_lock_without_resolving(
        tmp_path: Path) -> None:
    from foundation.version import sluice_version
    from predictors_runtime.environments import DependencyFiles, lock_environment
    from predictors_runtime.environments.lock import python_tag

    deployed = spec(requirements="humanize==4.9.0\n", server_pins=server_pins(), python=python_tag(),
                    platform=__import__("sysconfig").get_platform(), sluice_version=sluice_version())
    files = DependencyFiles("humanize==4.9.0\n", "echo this one has a script\n")
    # No process may start in this tier: a resolve (uv) would fail the test.
    locked = lock_environment(files, tmp_path, cache_dir=tmp_path, where="x", deployed=[deployed])
    assert locked.lock == deployed.lock and locked.shell == files.shell
    assert locked.key != deployed.key  # its dependencies.sh differs: an environment of its own


@pytest.mark.parametrize(("message", "name", "named"), [
    ("Because sluice-no-such-package-zz9 was not found in the package registry", "sluice", False),
    ("Because flask-cors==9.9 depends on werkzeug<1", "flask", False),
    ("Because you require celery==4.4.7 and celery==5.7.0, we can conclude", "celery", True),
    ("sluice-test-old-celery==1.0 depends on Celery<5", "celery", True),
    ("and typing_extensions>=4.6 is required", "typing-extensions", True),
    ("numpy.typing is missing", "numpy", False),
])
def test_a_pin_of_sluice_is_blamed_only_when_the_installer_names_that_very_package(
        message: str, name: str, named: bool) -> None:
    from predictors_runtime.environments.lock import names_package

    assert names_package(message, name) is named


def test_a_long_build_log_keeps_the_line_that_names_the_requirement_that_failed() -> None:
    from predictors_runtime.environments.uv_tool import UV_FAILURE_MARK, tail

    log = "\n".join([f"  {UV_FAILURE_MARK} Failed to build `scikit-learn==0.21.3`",
                     *[f"      compiler line {n}" for n in range(40)], "  hint: the build backend failed"])

    kept = tail(log, lines=5).splitlines()

    assert kept[0].strip() == f"{UV_FAILURE_MARK} Failed to build `scikit-learn==0.21.3`" and kept[1] == "..."
    assert kept[-1] == "  hint: the build backend failed" and len(kept) == 7


def test_nearest_wheels_moves_only_the_exact_pin_named_and_drops_a_pin_of_sluices_own() -> None:
    from predictors_runtime.environments.lock import repinned, take_sluices_versions

    text = "# an old project\nscikit-learn==0.21.3  # trained with it\nnumpy==1.16.0\nrequests>=2\n-r more.txt\n"

    moved_text, moves = take_sluices_versions(text, {"numpy": "2.4.6", "requests": "2.32.0"})
    assert moved_text == "# an old project\nscikit-learn==0.21.3  # trained with it\nrequests>=2\n-r more.txt\n"
    assert moves == ["numpy==1.16.0 -> numpy==2.4.6: Sluice's own numpy, which its nodes and replicas run on"]

    assert repinned(moved_text, "scikit_learn", "0.21.3", "1.0") == \
        "# an old project\nscikit-learn==1.0\nrequests>=2\n-r more.txt\n"
    assert repinned(moved_text, "scipy", "1.2.0", "1.5.0") is None  # a dependency, not a pin of the project
