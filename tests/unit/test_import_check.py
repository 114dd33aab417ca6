"""What a predictor imports that nothing will provide (`predictors_runtime/import_check.py`): read from
the project's files at deploy, never run."""

from __future__ import annotations

from pathlib import Path

from predictors_runtime.import_check import unprovided_imports


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_module_no_environment_has_is_named_with_where_it_is_imported(tmp_path: Path) -> None:
    project = write(tmp_path, {"predictor.py": "import os\nimport json\nimport yaml\nimport sluice_no_such_zz\n"})

    assert unprovided_imports(project, "predictor.py") == ["sluice_no_such_zz (predictor.py line 4)"]


def test_the_projects_own_modules_are_followed_not_named(tmp_path: Path) -> None:
    project = write(tmp_path, {
        "predictor.py": "from helpers import NAME\nimport lib.models\nfrom . import sibling\n",
        "helpers.py": "import sluice_missing_in_helpers\nNAME = 1\n",
        "lib/__init__.py": "",
        "lib/models.py": "from .util import x\n",
        "lib/util.py": "import sluice_missing_in_util\nx = 1\n",
        "sibling.py": "",
        "train.py": "import sluice_only_for_training\n",  # not imported by the predictor: not its concern
    })

    assert unprovided_imports(project, "predictor.py") == [
        "sluice_missing_in_helpers (helpers.py line 1)", "sluice_missing_in_util (lib/util.py line 1)"]


def test_an_import_a_try_block_guards_is_optional(tmp_path: Path) -> None:
    project = write(tmp_path, {"src/predictor.py": (
        "try:\n    import sluice_fast_json\nexcept ImportError:\n    sluice_fast_json = None\n"
        "from model_code import build\n"), "src/model_code.py": "def build():\n    import sluice_lazy_zz\n"})

    # The predictor's own folder counts as the project's too; an import inside a function is still one.
    assert unprovided_imports(project, "src/predictor.py") == ["sluice_lazy_zz (src/model_code.py line 2)"]
