"""A user's batch predictor as a worker builds it for a job and calls it batch after batch."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import PredictorError
from predictors_runtime.batch_predictor import BatchPredictor
from predictors_runtime.config import ApiConfig, parse_api_configs

JOB_SPEC = {"job_id": "0018bcfe5680a1b2c3d4", "api_name": "iris", "workers": 1, "config": {},
            "total_batch_count": 2, "start_time": "2023-11-14T22:13:20Z"}


def environ_of_the_process() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's own, per phase


@pytest.fixture(autouse=True)
def _the_process_is_left_as_it_was() -> Iterator[None]:
    """Building and calling predictors never leaves their path, variables or modules behind."""
    path, environ, modules = list(sys.path), environ_of_the_process(), set(sys.modules)
    yield
    assert sys.path == path
    assert environ_of_the_process() == environ
    assert not {name for name in set(sys.modules) - modules if name.startswith(("helpers", "sluice_predictor_"))}


def api_config(predictor: str = "{path: predictor.py}") -> ApiConfig:
    [api] = parse_api_configs(f"- name: iris\n  kind: BatchAPI\n  predictor: {predictor}\n")
    return api


def project(folder: Path, source: str, **files: str) -> Path:
    """A project folder holding predictor.py and any other files a test names."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(textwrap.dedent(source))
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def build(folder: Path, api: ApiConfig | None = None, job_config: dict[str, Any] | None = None) -> BatchPredictor:
    return BatchPredictor.build(folder, api or api_config(), JOB_SPEC, job_config or {})


ECHO = """
    class PythonPredictor:
        def __init__(self, config, job_spec):
            self.config = config
            self.job_spec = job_spec

        def predict(self, payload, batch_id):
            return {"payload": payload, "batch_id": batch_id, "config": self.config, "job_spec": self.job_spec}
"""


def test_the_predictor_is_constructed_with_the_apis_config_merged_with_the_jobs(tmp_path: Path) -> None:
    api = api_config("{path: predictor.py, config: {threshold: 0.5, labels: {a: 1, b: 2}, dest: s3://x}}")

    predictor = build(project(tmp_path, ECHO), api, job_config={"labels": {"b": 3}, "dest": "s3://y"})

    out = predictor.predict([[1, 2]], "batch-7")
    assert out["config"] == {"threshold": 0.5, "labels": {"a": 1, "b": 3}, "dest": "s3://y"}
    assert out["job_spec"] == JOB_SPEC
    assert (out["payload"], out["batch_id"]) == ([[1, 2]], "batch-7")


def test_the_apis_config_is_left_untouched_by_a_jobs_config(tmp_path: Path) -> None:
    api = api_config("{path: predictor.py, config: {labels: {a: 1}}}")

    build(project(tmp_path, ECHO), api, job_config={"labels": {"a": 9}})

    assert api.predictor.config == {"labels": {"a": 1}}


def test_a_predictor_declaring_only_what_it_needs_gets_only_that(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, """
        class Handler:
            def __init__(self, config):
                self.threshold = config.get("threshold", 0)

            def handle_batch(self, payload):
                return [x for x in payload if x > self.threshold]
    """), api_config("{path: predictor.py, config: {threshold: 2}}"))

    assert predictor.predict([1, 2, 3, 4], "b-1") == [3, 4]


def test_a_predictor_without_a_constructor_is_built(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, """
        class Handler:
            def handle_batch(self):
                return "ran"
    """))

    assert predictor.predict([1], "b-1") == "ran"


def test_handle_batch_is_preferred_over_predict(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, """
        class Handler:
            def handle_batch(self, payload):
                return "handle_batch"

            def predict(self, payload):
                return "predict"
    """))

    assert predictor.predict([1], "b-1") == "handle_batch"


def test_the_users_exception_in_predict_reaches_the_caller_unchanged(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, """
        class PythonPredictor:
            def predict(self, payload):
                raise KeyError("sepal_length")
    """))

    with pytest.raises(KeyError, match="sepal_length"):
        predictor.predict([{}], "b-1")


def test_user_code_runs_in_the_project_folder_and_the_working_directory_is_restored(tmp_path: Path) -> None:
    folder = project(tmp_path / "iris", """
        import os

        class PythonPredictor:
            def __init__(self):
                self.labels = open("labels.txt").read().split()
                self.init_cwd = os.getcwd()

            def predict(self, payload):
                return os.getcwd(), self.labels[payload[0]]
    """, **{"labels.txt": "setosa versicolor virginica"})
    before = os.getcwd()

    predictor = build(folder)
    assert os.getcwd() == before

    cwd, label = predictor.predict([2], "b-1")
    assert Path(cwd).resolve() == folder.resolve()
    assert label == "virginica"
    assert Path(predictor.instance.init_cwd).resolve() == folder.resolve()
    assert os.getcwd() == before


def test_the_working_directory_is_restored_when_predict_raises(tmp_path: Path) -> None:
    predictor = build(project(tmp_path / "iris", """
        class PythonPredictor:
            def predict(self, payload):
                raise ValueError("bad row")
    """))
    before = os.getcwd()

    with pytest.raises(ValueError, match="bad row"):
        predictor.predict([1], "b-1")

    assert os.getcwd() == before


def test_a_predictor_can_import_modules_beside_it(tmp_path: Path) -> None:
    module = f"iris_helpers_{tmp_path.name.replace('-', '_')}"
    folder = project(tmp_path, f"""
        from {module} import double

        class Handler:
            def handle_batch(self, payload):
                return [double(x) for x in payload]
    """, **{f"{module}.py": "def double(x):\n    return 2 * x\n"})
    assert build(folder).predict([1, 2], "b-1") == [2, 4]
    assert module not in sys.modules


def test_on_job_complete_gets_the_job_status_when_it_declares_it(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, """
        class PythonPredictor:
            def predict(self, payload):
                return payload

            def on_job_complete(self, job_status):
                self.seen = job_status
    """))
    status = {"job_id": "0018bcfe5680a1b2c3d4", "status": "status_running"}

    assert predictor.has_on_job_complete
    predictor.on_job_complete(status)

    assert predictor.instance.seen == status


def test_on_job_complete_without_parameters_is_called_without_them(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, """
        class PythonPredictor:
            def predict(self, payload):
                return payload

            def on_job_complete(self):
                open("complete.txt", "w").write("done")
    """))

    predictor.on_job_complete({"status": "status_running"})

    assert (tmp_path / "complete.txt").read_text() == "done"


def test_a_predictor_without_on_job_complete_is_not_asked_to_complete(tmp_path: Path) -> None:
    predictor = build(project(tmp_path, ECHO))

    assert not predictor.has_on_job_complete
    predictor.on_job_complete({"status": "status_running"})  # nothing to call, nothing raised


def test_an_init_that_raises_is_a_predictor_error_with_the_users_message(tmp_path: Path) -> None:
    folder = project(tmp_path, """
        class PythonPredictor:
            def __init__(self, config):
                raise ValueError("model.pkl is corrupt")

            def predict(self, payload):
                return payload
    """)

    with pytest.raises(PredictorError) as info:
        build(folder)

    message = info.value.message
    assert message.startswith("PythonPredictor.__init__ raised: ")
    assert "Traceback (most recent call last)" in message
    assert "ValueError: model.pkl is corrupt" in message
    assert isinstance(info.value.__cause__, ValueError)


def test_a_constructor_requiring_an_argument_sluice_lacks_is_a_predictor_error(tmp_path: Path) -> None:
    with pytest.raises(PredictorError, match="requires an argument 'python_client'"):
        build(project(tmp_path, """
            class PythonPredictor:
                def __init__(self, config, python_client):
                    pass

                def predict(self, payload):
                    return payload
        """))


def test_a_predictor_that_cannot_predict_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PredictorError, match="Handler has neither handle_batch\\(\\) nor predict\\(\\)"):
        build(project(tmp_path, """
            class Handler:
                def on_job_complete(self):
                    pass
        """))


def test_an_import_error_in_the_predictor_file_is_a_predictor_error(tmp_path: Path) -> None:
    before = os.getcwd()

    with pytest.raises(PredictorError, match="(?s)importing predictor.py failed: .*ZeroDivisionError"):
        build(project(tmp_path, "RATIO = 1 / 0\n"))

    assert os.getcwd() == before


# -- many APIs in one worker process -----------------------------------------------------------
SEES = """
    import os, sys
    import helpers
    from tools import shape

    class PythonPredictor:
        def __init__(self, config):
            self.at_init = helpers.who()

        def predict(self, payload):
            import helpers as now
            from tools.extra import EXTRA  # imported lazily, on the first batch
            return {
                "helpers": now.who(), "at_init": self.at_init, "shape": shape(), "extra": EXTRA,
                "ONLY_A": os.environ.get("ONLY_A"), "ONLY_B": os.environ.get("ONLY_B"),
                "bundles_on_path": sorted(p for p in sys.path if "bundle" in p),
            }
"""


def bundle(folder: Path, letter: str, version: str = "1") -> Path:
    """A project as a worker unpacks it: its own .env, and helpers/tools of the same names as any other's."""
    folder = project(folder, SEES, **{
        ".env": f"ONLY_{letter.upper()}=1\n",
        "helpers.py": f"def who():\n    return '{letter}{version}'\n",
    })
    (folder / "tools").mkdir()
    (folder / "tools" / "__init__.py").write_text(f"def shape():\n    return '{letter}-shape'\n")
    (folder / "tools" / "extra.py").write_text(f"EXTRA = '{letter}-extra'\n")
    return folder


def test_jobs_of_two_apis_in_one_process_each_see_only_their_own_env_modules_and_path(tmp_path: Path) -> None:
    a_folder, b_folder = bundle(tmp_path / "bundle-a", "a"), bundle(tmp_path / "bundle-b", "b")
    a, b = build(a_folder), build(b_folder)

    first_a, then_b, again_a = a.predict([1], "b-1"), b.predict([1], "b-1"), a.predict([2], "b-2")

    assert first_a == again_a == {
        "helpers": "a1", "at_init": "a1", "shape": "a-shape", "extra": "a-extra", "ONLY_A": "1", "ONLY_B": None,
        "bundles_on_path": [str(a_folder.resolve())],
    }
    assert then_b == {
        "helpers": "b1", "at_init": "b1", "shape": "b-shape", "extra": "b-extra", "ONLY_A": None, "ONLY_B": "1",
        "bundles_on_path": [str(b_folder.resolve())],
    }
    assert "ONLY_A" not in os.environ and "helpers" not in sys.modules
    a.close()
    b.close()


def test_a_redeployed_bundle_runs_its_new_helpers_while_the_old_jobs_keep_theirs(tmp_path: Path) -> None:
    old = build(bundle(tmp_path / "bundle-1", "a", version="1"))
    assert old.predict([1], "b-1")["helpers"] == "a1"

    new = build(bundle(tmp_path / "bundle-2", "a", version="2"))

    assert new.predict([1], "b-1")["helpers"] == "a2"
    assert old.predict([1], "b-2")["helpers"] == "a1"
    old.close()
    new.close()


def test_the_process_environment_is_restored_after_a_batch_that_raises(tmp_path: Path) -> None:
    folder = project(tmp_path / "bundle", """
        import os

        class PythonPredictor:
            def predict(self, payload):
                os.environ["LEAKED"] = "no"
                import helpers
                raise ValueError(helpers.who())
    """, **{".env": "ONLY_A=1\n", "helpers.py": "def who():\n    return 'raised here'\n"})
    predictor = build(folder)
    environ, path, cwd = environ_of_the_process(), list(sys.path), os.getcwd()

    with pytest.raises(ValueError, match="raised here"):
        predictor.predict([1], "b-1")

    assert (environ_of_the_process(), sys.path, os.getcwd()) == (environ, path, cwd)
    assert "helpers" not in sys.modules
    predictor.close()


def test_python_path_folders_come_before_the_project_folder(tmp_path: Path) -> None:
    folder = project(tmp_path / "bundle", """
        import sys
        import helpers

        class PythonPredictor:
            def predict(self, payload):
                return helpers.who(), sys.path[:2]
    """, **{"helpers.py": "def who():\n    return 'project'\n"})
    (folder / "src").mkdir()
    (folder / "src" / "helpers.py").write_text("def who():\n    return 'python_path'\n")

    predictor = build(folder, api_config("{path: predictor.py, python_path: src}"))

    assert predictor.predict([1], "b-1") == ("python_path", [str((folder / "src").resolve()), str(folder.resolve())])
    predictor.close()


def test_closing_a_jobs_predictor_lets_go_of_its_modules(tmp_path: Path) -> None:
    predictor = build(bundle(tmp_path / "bundle", "a"))
    predictor.predict([1], "b-1")
    assert "helpers" in predictor.built.namespace.module_names()

    predictor.close()

    assert predictor.built.namespace.module_names() == []
