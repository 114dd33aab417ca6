"""ONNX, TensorFlow and Python predictors load their models from local disk, S3 and GCS in batch jobs."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from predictors_runtime.storage import join_uri, storage_for
from sluice.client import ClientError

pytestmark = pytest.mark.integration

ONNX_PREDICTOR = '''
import numpy as np

class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client = onnx_client
        self.inputs = onnx_client.get_model()["input_signatures"]

    def predict(self, payload):
        labels, _ = self.client.predict(np.array(payload, dtype=np.float32))
        return [{"label": int(label), "input_type": self.inputs["X"]["type"]} for label in labels]
'''

TF_PREDICTOR = '''
class TensorFlowPredictor:
    def __init__(self, tensorflow_client, config):
        self.client = tensorflow_client

    def predict(self, payload):
        values = self.client.predict(payload)["y"]  # flat, as Cortex's client gave each output
        width = len(values) // len(payload)
        return [{"y": values[i * width:(i + 1) * width]} for i in range(len(payload))]
'''

PYTHON_PREDICTOR = '''
import time

class PythonPredictor:
    def __init__(self, config, python_client):
        self.client = python_client
        self.config = config

    def load_model(self, model_path):
        with open(model_path + "/weights.txt") as f:
            return f.read().strip()

    def predict(self, payload, batch_id):
        time.sleep(self.config.get("sleep", 0))
        rows = []
        for item in payload:
            name = item.get("model") if isinstance(item, dict) else None
            version = item.get("version", "latest") if isinstance(item, dict) else "latest"
            rows.append({"item": item, "model": self.client.get_model(name, version)})
        return rows
'''


@pytest.fixture(scope="module")
def iris_onnx():
    """A real scikit-learn iris classifier converted with skl2onnx, and the sklearn model."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris()
    features = iris.data.astype(np.float32)
    model = LogisticRegression(max_iter=1000).fit(features, iris.target)
    onnx_model = to_onnx(model, features[:1], options={id(model): {"zipmap": False}})
    return onnx_model.SerializeToString(), model, features


def put(uri: str, data: bytes | str) -> None:
    storage_for(uri).write_bytes(uri, data.encode() if isinstance(data, str) else data)


def read_rows(out: str, job_id: str) -> list[dict]:
    storage = storage_for(out)
    manifest = json.loads(storage.read_bytes(join_uri(out, job_id, "_manifest.json")))
    rows = []
    for part in manifest["parts"]:
        rows += [json.loads(line) for line in storage.read_bytes(part["path"]).decode().splitlines()]
    return rows


def test_an_onnx_predictor_classifies_rows_with_a_model_from_each_storage(
        client, deploy_project, tmp_path, root, iris_onnx):
    model_bytes, sklearn_model, features = iris_onnx
    put(join_uri(root, "models/iris/1/model.onnx"), model_bytes)
    api = deploy_project(source=ONNX_PREDICTOR, predictor_type="onnx",
                         predictor_extra={"models": {"path": join_uri(root, "models/iris")}})
    out = str(tmp_path / "out")

    spec = client.submit_raw(api, {"workers": 2, "item_list": {"items": features.tolist(), "batch_size": 32},
                                   "output": {"path": out}})

    assert client.wait(api, spec["job_id"], timeout=180)["status"] == "status_succeeded"
    rows = read_rows(out, spec["job_id"])
    assert [row["label"] for row in rows] == sklearn_model.predict(features).tolist()
    assert rows[0]["input_type"] == "float32"


def test_a_tensorflow_predictor_gets_outputs_by_name_from_a_saved_model(client, deploy_project, tmp_path):
    import tensorflow as tf

    class Linear(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            return {"y": tf.matmul(x, tf.constant([[1.0, 0.0], [0.0, 2.0]])) + 1.0}

    module = Linear()
    model_dir = tmp_path / "models" / "linear" / "3"
    tf.saved_model.save(module, str(model_dir), signatures={"serving_default": module.serve})
    api = deploy_project(source=TF_PREDICTOR, predictor_type="tensorflow",
                         predictor_extra={"models": {"path": str(model_dir.parent),
                                                     "signature_key": "serving_default"}})
    out = str(tmp_path / "out")

    spec = client.submit_raw(api, {"item_list": {"items": [[1, 1], [2, 3], [0, 0]], "batch_size": 2},
                                   "output": {"path": out}})

    assert client.wait(api, spec["job_id"], timeout=180)["status"] == "status_succeeded"
    assert [row["y"] for row in read_rows(out, spec["job_id"])] == [[2.0, 3.0], [3.0, 7.0], [1.0, 1.0]]


def test_a_python_predictor_picks_models_and_versions_from_a_models_dir(client, deploy_project, tmp_path, root):
    for name in ("alpha", "beta"):
        for version in (1, 2):
            put(join_uri(root, f"zoo/{name}/{version}/weights.txt"), f"{name}-v{version}")
    api = deploy_project(source=PYTHON_PREDICTOR,
                         predictor_extra={"models": {"dir": join_uri(root, "zoo"), "cache_size": 1,
                                                     "disk_cache_size": 2}})
    out = str(tmp_path / "out")
    items = [{"model": "alpha"}, {"model": "beta", "version": "1"}, {"model": "alpha", "version": 1},
             {"model": "beta"}]

    spec = client.submit_raw(api, {"item_list": {"items": items, "batch_size": 4}, "output": {"path": out}})

    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"
    assert [row["model"] for row in read_rows(out, spec["job_id"])] == ["alpha-v2", "beta-v1", "alpha-v1", "beta-v2"]


def test_an_unknown_model_name_fails_the_batch_with_a_clear_error(client, deploy_project, tmp_path):
    put(str(tmp_path / "zoo/alpha/1/weights.txt"), "alpha-v1")
    api = deploy_project(source=PYTHON_PREDICTOR, predictor_extra={"models": {"dir": str(tmp_path / "zoo")}})

    spec = client.submit_raw(api, {"item_list": {"items": [{"model": "gamma"}], "batch_size": 1}})

    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_completed_with_failures"
    error = client.failed_batches(api, spec["job_id"])[0]["error"]
    assert "gamma" in error and "alpha" in error


def test_a_version_added_while_a_job_runs_is_used_by_later_batches(client, deploy_project, tmp_path):
    models = tmp_path / "model"
    put(str(models / "1" / "weights.txt"), "v1")
    api = deploy_project({"sleep": 0.1}, source=PYTHON_PREDICTOR, predictor_extra={"models": {"path": str(models)}})
    out = str(tmp_path / "out")
    spec = client.submit_raw(api, {"item_list": {"items": list(range(60)), "batch_size": 1}, "output": {"path": out}})
    deadline = time.monotonic() + 60
    while client.job(api, spec["job_id"])["batch_metrics"]["succeeded"] < 5:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    put(str(models / "2" / "weights.txt"), "v2")

    final = client.wait(api, spec["job_id"], timeout=120)
    assert final["status"] == "status_succeeded" and final["batch_metrics"]["failed"] == 0
    seen = [row["model"] for row in read_rows(out, spec["job_id"])]
    assert seen[0] == "v1" and seen[-1] == "v2"
    assert seen == sorted(seen)  # once v2 is in, every later batch uses it


@pytest.mark.parametrize(("kind", "files", "reason"), [
    ("onnx", ["1/weights.bin"], "exactly one *.onnx"),
    ("onnx", ["1/a.onnx", "1/b.onnx"], "exactly one *.onnx"),
    ("tensorflow", ["2/saved_model.pb"], "variables"),
])
def test_a_bad_model_layout_is_refused_at_deploy_naming_the_path(deploy_project, tmp_path, kind, files, reason):
    for name in files:
        put(str(tmp_path / "bad" / name), b"x")

    with pytest.raises(ClientError) as refused:
        deploy_project(source=ONNX_PREDICTOR, predictor_type=kind,
                       predictor_extra={"models": {"path": str(tmp_path / "bad")}})

    assert refused.value.http_status == 400
    assert str(tmp_path / "bad") in refused.value.server_message
    assert reason in refused.value.server_message


@pytest.mark.parametrize(("compute", "queue"), [({"gpu": 1}, "gpu"), ({"inf": 1}, "inf"), ({"cpu": 2}, "cpu")])
def test_an_api_goes_to_the_queue_of_its_hardware(client, deploy_project, tmp_path, iris_onnx, compute, queue):
    put(str(tmp_path / "m" / "model.onnx"), iris_onnx[0])
    api = deploy_project(source=ONNX_PREDICTOR, predictor_type="onnx", compute=compute,
                         predictor_extra={"models": {"path": str(tmp_path / "m")}})

    assert client.api(api)["queue"] == queue
    spec = client.submit(api, iris_onnx[2][:4].tolist(), batch_size=4)
    # The test nodes serve every queue; with no GPU here, ONNX falls back to the CPU.
    assert client.wait(api, spec["job_id"], timeout=120)["status"] == "status_succeeded"
