"""The one predictor builder: batch jobs and realtime replicas construct a user's predictor the same way."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import PredictorError
from predictors_runtime.builder import BuiltPredictor, build_predictor
from predictors_runtime.config import ApiConfig, parse_api_configs
from predictors_runtime.namespace import active_namespace


def api_config(kind: str = "RealtimeAPI", predictor: str = "{path: predictor.py}") -> ApiConfig:
    [api] = parse_api_configs(f"- name: iris\n  kind: {kind}\n  predictor: {predictor}\n")
    return api


def project(folder: Path, source: str, **files: str | bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(textwrap.dedent(source))
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return folder


def build(folder: Path, init_args: dict[str, Any], api: ApiConfig | None = None) -> BuiltPredictor:
    return build_predictor(folder, api or api_config(), init_args,
                           model_cache_dir=folder.parent / "models", poll_interval_s=10.0)


REALTIME = """
    import os
    import helpers

    class PythonPredictor:
        def __init__(self, config):
            self.config = config
            self.greeting = os.environ.get("GREETING")

        def predict(self, payload, query_params, headers):
            return helpers.answer(payload)

        def post_predict(self, response):
            pass
"""


def test_a_realtime_predictor_is_built_with_the_apis_config_and_env(tmp_path: Path) -> None:
    folder = project(tmp_path / "bundle", REALTIME, **{
        "helpers.py": "def answer(x):\n    return x * 2\n", ".env": "GREETING=from dotenv\n",
    })
    api = api_config(predictor="{path: predictor.py, config: {k: 1}, env: {GREETING: from cortex.yaml}}")

    built = build(folder, {"config": api.predictor.config}, api)

    assert built.instance.config == {"k": 1}
    assert built.instance.greeting == "from cortex.yaml"  # predictor.env wins over .env
    assert (built.api, built.project_dir, built.client) == (api, folder, None)
    with built.namespace.active():
        assert built.method("handle_post", "predict")(3, {}, {}) == 6
    assert built.method("post_predict") is not None
    assert built.method("on_job_complete") is None
    assert "GREETING" not in os.environ and "helpers" not in sys.modules
    built.close()


def test_init_gets_only_what_it_declares_of_what_the_mode_offers(tmp_path: Path) -> None:
    folder = project(tmp_path / "bundle", """
        class Handler:
            def __init__(self, job_spec):
                self.job_spec = job_spec
    """)

    built = build(folder, {"config": {}, "job_spec": {"job_id": "j-1"}})

    assert built.instance.job_spec == {"job_id": "j-1"}
    built.close()


def test_an_init_that_raises_leaves_no_namespace_in_place_and_no_module_behind(tmp_path: Path) -> None:
    folder = project(tmp_path / "bundle", """
        import helpers

        class PythonPredictor:
            def __init__(self, config):
                raise RuntimeError(helpers.why())
    """, **{"helpers.py": "def why():\n    return 'the model file is corrupt'\n", ".env": "ONLY_A=1\n"})
    cwd = os.getcwd()

    with pytest.raises(PredictorError, match="(?s)PythonPredictor.__init__ raised: .*the model file is corrupt"):
        build(folder, {"config": {}})

    assert active_namespace() is None
    assert (os.getcwd(), os.environ.get("ONLY_A")) == (cwd, None)
    assert "helpers" not in sys.modules and not any(name.startswith("sluice_predictor_") and
                                                    str(folder) in str(getattr(m, "__file__", ""))
                                                    for name, m in sys.modules.items())


def test_an_unreadable_dotenv_is_a_predictor_error(tmp_path: Path) -> None:
    folder = project(tmp_path / "bundle", "class Handler:\n    pass\n", **{".env": b"KEY=\xff\xfe\n"})

    with pytest.raises(PredictorError, match="reading the project's .env failed"):
        build(folder, {"config": {}})


@pytest.mark.parametrize("argument", ["python_client", "model_client"], ids=["cortex-0.25-0.33", "cortex-0.34-0.35"])
def test_a_python_handler_takes_its_client_under_the_name_its_cortex_version_gave_it(tmp_path: Path,
                                                                                      argument: str) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.txt").write_text("0.5")
    folder = project(tmp_path / "bundle", f"""
        class Handler:
            def __init__(self, config, {argument}):
                self.weight = {argument}.get_model()

            def load_model(self, model_path):
                return float(open(model_path + "/weights.txt").read())
    """)
    api = api_config(predictor=f"{{path: predictor.py, models: {{path: {tmp_path / 'model'}}}}}")

    built = build(folder, {"config": {}}, api)

    assert built.instance.weight == 0.5
    built.close()


def test_a_python_predictor_with_models_gets_its_client_bound_to_load_model_before_init(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.txt").write_text("0.75")
    folder = project(tmp_path / "bundle", """
        class PythonPredictor:
            def __init__(self, config, python_client):
                self.weight = python_client.get_model()

            def load_model(self, model_path):
                return float(open(model_path + "/weights.txt").read())
    """)
    api = api_config(predictor=f"{{path: predictor.py, models: {{path: {tmp_path / 'model'}}}}}")

    built = build(folder, {"config": {}}, api)

    assert built.instance.weight == 0.75
    assert built.client is not None
    built.close()
