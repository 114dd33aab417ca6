"""Model discovery, loading and live reloading on real object stores: S3 (moto server) and GCS (emulator).

Each test runs once per store through the `root` fixture, which yields a fresh root URI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from foundation.errors import ConfigError
from predictors_runtime.config import ModelsConfig
from predictors_runtime.models import DEFAULT_MODEL_NAME, ModelManager, discover
from predictors_runtime.storage import join_uri, split_uri, storage_for

pytestmark = pytest.mark.integration


@pytest.fixture(params=["s3", "gcs"])
def root(request: pytest.FixtureRequest) -> str:
    if request.param == "s3":
        return f"s3://{request.getfixturevalue('s3_bucket')}/models"
    return f"gs://{request.getfixturevalue('gcs_bucket')}/models"


def put(root: str, name: str, data: bytes) -> None:
    storage_for(root).write_bytes(join_uri(root, name), data)


def delete(root: str, name: str) -> None:
    """Storage has no delete (Sluice never deletes users' files); the tests use the stores' own clients."""
    scheme, bucket, key = split_uri(join_uri(root, name))
    if scheme == "s3":
        import boto3

        boto3.client("s3").delete_object(Bucket=bucket, Key=key)
    else:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        storage.Client(project="test", credentials=AnonymousCredentials()).bucket(bucket).blob(key).delete()


def read_model(path: Path) -> bytes:
    return (path / "model.onnx").read_bytes()


def test_a_models_dir_is_discovered_loaded_and_live_reloaded(root: str, tmp_path: Path) -> None:
    put(root, "iris/1/model.onnx", b"iris one")
    put(root, "iris/2/model.onnx", b"iris two")
    put(root, "wine/model.onnx", b"wine")
    put(root, "README.md", b"not a model")
    models = ModelsConfig(dir=root + "/")
    found = discover(models, "onnx")
    assert {name: sorted(v) for name, v in found.items()} == {"iris": [1, 2], "wine": [1]}
    assert found["iris"][2].uri == join_uri(root, "iris", "2")

    manager = ModelManager(models, "onnx", tmp_path / "cache", read_model)
    assert manager.names() == ["iris", "wine"]
    assert manager.get("iris").model == b"iris two"
    assert manager.get("iris", "1").model == b"iris one"
    wine = manager.get("wine")
    assert wine.model == b"wine"

    put(root, "iris/3/model.onnx", b"iris three")
    assert manager.poll_once(1.0) == ["model iris: version 3 added", "model iris: version 3 loaded"]
    assert manager.get("iris").model == b"iris three"

    put(root, "iris/3/model.onnx", b"iris three, retrained")
    assert manager.poll_once(2.0) == ["model iris: version 3 changed", "model iris: version 3 loaded"]
    assert manager.get("iris").model == b"iris three, retrained"

    delete(root, "iris/3/model.onnx")
    delete(root, "wine/model.onnx")
    # Version 2, the latest again, is still in memory: nothing to load.
    assert manager.poll_once(3.0) == ["model iris: version 3 removed", "model wine: version 1 removed"]
    assert manager.names() == ["iris"] and manager.versions("iris") == [1, 2]
    assert manager.get("iris").model == b"iris two"
    assert not wine.path.exists()


def test_a_single_versioned_model_path_serves_its_latest(root: str, tmp_path: Path) -> None:
    put(root, "tf/4/saved_model.pb", b"graph four")
    put(root, "tf/4/variables/variables.index", b"index")
    put(root, "tf/10/saved_model.pb", b"graph ten")
    put(root, "tf/10/variables/variables.index", b"index")
    put(root, "tf/10/variables/variables.data-00000-of-00001", b"weights")
    manager = ModelManager(ModelsConfig(path=join_uri(root, "tf")), "tensorflow", tmp_path / "cache",
                           lambda path: sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()))
    latest = manager.get()
    assert (latest.name, latest.version) == (DEFAULT_MODEL_NAME, 10)
    assert latest.model == ["saved_model.pb", "variables/variables.data-00000-of-00001",
                            "variables/variables.index"]
    assert (latest.path / "saved_model.pb").read_bytes() == b"graph ten"
    assert manager.get(model_version=4).version == 4


def test_a_bad_layout_in_a_bucket_names_the_uri_and_reason(root: str) -> None:
    put(root, "m/1/model.onnx", b"one")
    put(root, "m/2/weights.bin", b"two")
    with pytest.raises(ConfigError) as info:
        discover(ModelsConfig(path=join_uri(root, "m")), "onnx")
    assert info.value.message == f"{join_uri(root, 'm', '2')}: an ONNX model needs exactly one *.onnx file, found 0"
    with pytest.raises(ConfigError, match=f"^{join_uri(root, 'nothing')}: the folder of model _default is missing"):
        discover(ModelsConfig(path=join_uri(root, "nothing")), "python")
