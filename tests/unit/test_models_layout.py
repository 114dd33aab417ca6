"""Finding model folders and versions in storage, and refusing layouts a predictor type cannot load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from predictors_runtime.config import ModelsConfig
from predictors_runtime.models.layout import (
    DEFAULT_MODEL_NAME,
    LayoutProblem,
    ModelVersion,
    discover,
    model_sources,
    scan,
)


def write(root: Path, *names: str, data: bytes = b"x") -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_a_folder_of_files_is_one_unversioned_model_exposed_as_version_1(tmp_path: Path) -> None:
    write(tmp_path / "m", "model.pkl", "data/vocab.txt")
    found = discover(ModelsConfig(path=str(tmp_path / "m")), "python")
    assert list(found) == [DEFAULT_MODEL_NAME]
    version = found[DEFAULT_MODEL_NAME][1]
    assert isinstance(version, ModelVersion)
    assert (version.name, version.version, version.uri) == (DEFAULT_MODEL_NAME, 1, str(tmp_path / "m"))
    assert [path for path, _ in version.files] == ["data/vocab.txt", "model.pkl"]


def test_integer_named_folders_are_versions(tmp_path: Path) -> None:
    write(tmp_path / "m", "1/model.onnx", "2/model.onnx", "10/model.onnx", "10/extra/notes.txt")
    found = discover(ModelsConfig(path=str(tmp_path / "m") + "/"), "onnx")
    assert sorted(found[DEFAULT_MODEL_NAME]) == [1, 2, 10]
    ten = found[DEFAULT_MODEL_NAME][10]
    assert ten.uri == str(tmp_path / "m" / "10")
    assert [path for path, _ in ten.files] == ["extra/notes.txt", "model.onnx"]


def test_a_file_beside_version_folders_makes_the_folder_one_unversioned_model(tmp_path: Path) -> None:
    write(tmp_path / "m", "1/model.pkl", "2/model.pkl", "README.md")
    assert sorted(discover(ModelsConfig(path=str(tmp_path / "m")), "python")[DEFAULT_MODEL_NAME]) == [1]


def test_a_non_integer_folder_beside_version_folders_makes_one_unversioned_model(tmp_path: Path) -> None:
    write(tmp_path / "m", "1/model.pkl", "assets/model.pkl")
    found = discover(ModelsConfig(path=str(tmp_path / "m")), "python")[DEFAULT_MODEL_NAME]
    assert sorted(found) == [1]
    assert [p for p, _ in found[1].files] == ["1/model.pkl", "assets/model.pkl"]


def test_paths_name_each_model(tmp_path: Path) -> None:
    write(tmp_path, "iris/model.onnx", "wine/3/model.onnx", "wine/5/model.onnx")
    models = ModelsConfig(paths=[{"name": "iris", "path": str(tmp_path / "iris")},
                                 {"name": "red-wine", "path": str(tmp_path / "wine")}])
    assert model_sources(models) == {"iris": str(tmp_path / "iris"), "red-wine": str(tmp_path / "wine")}
    found = discover(models, "onnx")
    assert {name: sorted(v) for name, v in found.items()} == {"iris": [1], "red-wine": [3, 5]}


def test_dir_holds_one_model_per_sub_folder_and_ignores_files_beside_them(tmp_path: Path) -> None:
    write(tmp_path / "models", "text-generator/model.pkl", "sentiment/24753823/m.pkl",
          "sentiment/26234288/m.pkl", "README.md")
    models = ModelsConfig(dir=str(tmp_path / "models"))
    assert model_sources(models) == {
        "sentiment": str(tmp_path / "models" / "sentiment"),
        "text-generator": str(tmp_path / "models" / "text-generator"),
    }
    found = discover(models, "python")
    assert {name: sorted(v) for name, v in found.items()} == {
        "sentiment": [24753823, 26234288], "text-generator": [1]}
    assert found["sentiment"][26234288].uri == str(tmp_path / "models" / "sentiment" / "26234288")


def test_the_fingerprint_changes_when_a_file_is_rewritten(tmp_path: Path) -> None:
    write(tmp_path / "m", "model.pkl", data=b"one")
    before = discover(ModelsConfig(path=str(tmp_path / "m")), "python")[DEFAULT_MODEL_NAME][1]
    write(tmp_path / "m", "model.pkl", data=b"three")
    after = discover(ModelsConfig(path=str(tmp_path / "m")), "python")[DEFAULT_MODEL_NAME][1]
    assert before.files != after.files
    assert discover(ModelsConfig(path=str(tmp_path / "m")), "python")[DEFAULT_MODEL_NAME][1] == after


@pytest.mark.parametrize("files, found", [
    (["weights.bin"], "found 0"),
    (["a.onnx", "b.onnx"], "found 2 (a.onnx, b.onnx)"),
    (["nested/model.onnx"], "found 0"),
])
def test_an_onnx_version_needs_exactly_one_onnx_file_at_its_top(tmp_path: Path, files: list[str], found: str) -> None:
    write(tmp_path / "m", *(f"2/{name}" for name in files), "1/model.onnx")
    with pytest.raises(ConfigError) as info:
        discover(ModelsConfig(path=str(tmp_path / "m")), "onnx")
    assert info.value.message == f"{tmp_path / 'm' / '2'}: an ONNX model needs exactly one *.onnx file, {found}"


@pytest.mark.parametrize("files, missing", [
    (["saved_model.pb"], "a variables/ folder with at least one file"),
    (["variables/variables.index"], "saved_model.pb"),
    (["model.onnx"], "saved_model.pb and a variables/ folder with at least one file"),
])
def test_a_tensorflow_model_needs_saved_model_pb_and_variables(tmp_path: Path, files: list[str], missing: str) -> None:
    write(tmp_path / "tf", *files)
    with pytest.raises(ConfigError) as info:
        discover(ModelsConfig(path=str(tmp_path / "tf")), "tensorflow")
    assert info.value.message.startswith(f"{tmp_path / 'tf'}: a TensorFlow SavedModel needs")
    assert info.value.message.endswith(f"missing {missing}")


def test_a_complete_savedmodel_is_accepted(tmp_path: Path) -> None:
    write(tmp_path / "tf", "7/saved_model.pb", "7/variables/variables.index",
          "7/variables/variables.data-00000-of-00001")
    assert sorted(discover(ModelsConfig(path=str(tmp_path / "tf")), "tensorflow")[DEFAULT_MODEL_NAME]) == [7]


def test_a_missing_model_path_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'nope'}: the folder of model _default is missing or empty$"):
        discover(ModelsConfig(path=str(tmp_path / "nope")), "python")


def test_an_empty_path_of_a_named_model_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    write(tmp_path, "iris/model.onnx")
    models = ModelsConfig(paths=[{"name": "iris", "path": str(tmp_path / "iris")},
                                 {"name": "wine", "path": str(tmp_path / "empty")}])
    with pytest.raises(ConfigError, match="empty: the folder of model wine is missing or empty"):
        discover(models, "onnx")


def test_a_model_path_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "model.onnx")
    with pytest.raises(ConfigError, match="must be a folder, not a file"):
        discover(ModelsConfig(path=str(tmp_path / "model.onnx")), "onnx")


def test_an_empty_models_dir_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(ConfigError, match="the models dir is missing or empty"):
        discover(ModelsConfig(dir=str(tmp_path / "models")), "python")
    write(tmp_path / "models", "README.md")
    with pytest.raises(ConfigError, match="the models dir holds no model folders"):
        discover(ModelsConfig(dir=str(tmp_path / "models")), "python")


def test_a_bad_model_inside_dir_names_its_folder(tmp_path: Path) -> None:
    write(tmp_path / "models", "good/model.onnx", "bad/1/model.txt")
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'models' / 'bad' / '1'}: an ONNX model"):
        discover(ModelsConfig(dir=str(tmp_path / "models")), "onnx")


def test_an_unknown_predictor_type_is_an_error(tmp_path: Path) -> None:
    write(tmp_path / "m", "model.pkl")
    with pytest.raises(ConfigError, match="'torch' is not one of python, onnx, tensorflow"):
        discover(ModelsConfig(path=str(tmp_path / "m")), "torch")


def test_scan_with_a_problem_list_skips_what_it_cannot_accept(tmp_path: Path) -> None:
    write(tmp_path, "iris/1/model.onnx", "iris/2/half-uploaded.bin", "wine/model.onnx")
    os.remove(tmp_path / "wine" / "model.onnx")
    models = ModelsConfig(paths=[{"name": "iris", "path": str(tmp_path / "iris")},
                                 {"name": "wine", "path": str(tmp_path / "wine")}])
    problems: list[LayoutProblem] = []
    found = scan(models, "onnx", problems)
    assert {name: sorted(v) for name, v in found.items()} == {"iris": [1]}
    assert [(p.name, p.version) for p in problems] == [("iris", 2), ("wine", None)]
    assert "found 0" in problems[0].message
