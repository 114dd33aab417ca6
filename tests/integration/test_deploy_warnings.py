"""A deploy warns about what will fail later: a module the predictor imports that its environment will not
have (no requirements.txt, and not installed beside Sluice). The deploy itself succeeds: the module may come
from elsewhere (an image with more packages on the worker hosts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice.client import Client
from sluice.embedded import Stack
from tests.integration.conftest import write_project

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IMPORTS_A_MISSING_MODULE = "import sluice_no_such_module_zz\n\n\nclass PythonPredictor:\n" \
    "    def __init__(self, config, job_spec=None):\n        pass\n\n    def predict(self, payload, batch_id=None):\n" \
    "        return payload\n"


def test_a_deploy_names_a_module_the_predictor_imports_that_nothing_provides(client: Client, tmp_path: Path) -> None:
    config = write_project(tmp_path / "warned", "warned", source=IMPORTS_A_MISSING_MODULE)

    [deployed] = client.deploy(config)

    assert deployed["warnings"] == [
        "imports sluice_no_such_module_zz (predictor.py line 1), which is not installed beside Sluice and the "
        "project has no requirements.txt: its first batch or request will fail to import it (add it to a "
        "requirements.txt)"]
    client.delete_api("warned", force=True)


def test_sluice_deploy_prints_the_warning_and_a_clean_project_gets_none(stack: Stack, client: Client,
                                                                         tmp_path: Path) -> None:
    warned = write_project(tmp_path / "warned-cli", "warned-cli", source=IMPORTS_A_MISSING_MODULE)
    clean = write_project(tmp_path / "clean-cli", "clean-cli")

    shown = subprocess.run([sys.executable, "-m", "sluice.cli", "--url", stack.url, "deploy", str(warned)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    [clean_answer] = client.deploy(clean)

    assert shown.returncode == 0, shown.stderr
    assert "warning: warned-cli imports sluice_no_such_module_zz (predictor.py line 1)" in shown.stderr
    assert "warnings" not in clean_answer
    for name in ("warned-cli", "clean-cli"):
        client.delete_api(name, force=True)


def test_a_deploy_with_a_nearest_wheels_field_that_is_not_yes_or_no_is_refused_naming_it(
        stack: Stack, tmp_path: Path) -> None:
    import requests

    from predictors_runtime.project import pack_project

    config = write_project(tmp_path / "flagged", "flagged")
    files = {"config": ("cortex.yaml", config.read_bytes(), "application/yaml"),
             "project": ("project.tar.gz", pack_project(config.parent, config), "application/gzip")}

    answer = requests.post(f"{stack.url}/apis", files=files, data={"nearest_wheels": "maybe"}, timeout=60)

    assert answer.status_code == 400
    assert answer.json()["message"] == "multipart field 'nearest_wheels' must be 1 or 0 (got 'maybe')"
