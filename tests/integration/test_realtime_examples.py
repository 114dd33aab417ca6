"""Realtime projects as users bring them: the shipped examples, and the predictors of Cortex's documents.

Each test deploys a project as a RealtimeAPI into the running stack, waits until `GET /<api>`
says it is ready, and sends the request its README (or Cortex's documentation) shows with curl,
through Sluice's public URL. The predictors of Cortex's documents are kept as those documents
give them; only the models are made here: an skl2onnx iris classifier, a small TensorFlow
SavedModel with a `class_ids` output, and scikit-learn regressors saved with `mlflow.sklearn`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml

from sluice.client import Client
from sluice.embedded import Stack

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
READY_TIMEOUT_S = 240  # a replica imports its runtime (TensorFlow is the slowest) and loads its models
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
LABELS = ["setosa", "versicolor", "virginica"]

# One flower of each species, as the examples' curl lines send them.
SETOSA = {"sepal_length": 5.2, "sepal_width": 3.6, "petal_length": 1.4, "petal_width": 0.3}
VERSICOLOR = {"sepal_length": 6.4, "sepal_width": 3.2, "petal_length": 4.5, "petal_width": 1.5}
VIRGINICA = {"sepal_length": 6.3, "sepal_width": 3.3, "petal_length": 6.0, "petal_width": 2.5}
FLOWERS = [SETOSA, VERSICOLOR, VIRGINICA]

# -- the predictors of Cortex's documents, as they give them ---------------------------------------

CORTEX_ONNX_IRIS = '''
labels = ["setosa", "versicolor", "virginica"]


class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client = onnx_client

    def predict(self, payload):
        model_input = [
            payload["sepal_length"],
            payload["sepal_width"],
            payload["petal_length"],
            payload["petal_width"],
        ]

        prediction = self.client.predict(model_input)
        predicted_class_id = prediction[0][0]
        return labels[predicted_class_id]
'''

CORTEX_TENSORFLOW_IRIS = '''
labels = ["setosa", "versicolor", "virginica"]


class TensorFlowPredictor:
    def __init__(self, tensorflow_client, config):
        self.client = tensorflow_client

    def predict(self, payload):
        prediction = self.client.predict(payload)
        predicted_class_id = int(prediction["class_ids"][0])
        return labels[predicted_class_id]
'''

CORTEX_PYTHON_MPG = '''
import mlflow.sklearn
import numpy as np


class PythonPredictor:
    def __init__(self, config, python_client):
        self.client = python_client

    def load_model(self, model_path):
        return mlflow.sklearn.load_model(model_path)

    def predict(self, payload, query_params):
        model_version = query_params.get("version")
        model = self.client.get_model(model_version=model_version)
        model_input = [
            payload["cylinders"],
            payload["displacement"],
            payload["horsepower"],
            payload["weight"],
            payload["acceleration"],
        ]
        result = model.predict([model_input]).item()
        return {"prediction": result, "model": {"version": model_version}}
'''

# Cortex's sample for the mpg-estimator: `curl .../mpg-estimator?version=1 -d @sample.json`
MPG_SAMPLE = {"cylinders": 4, "displacement": 135, "horsepower": 84, "weight": 2490, "acceleration": 15.7}


# -- helpers -----------------------------------------------------------------------------------------

def write_realtime_project(folder: Path, name: str, predictor_type: str, source: str,
                           predictor: dict[str, Any] | None = None) -> Path:
    """A Cortex RealtimeAPI project (cortex.yaml + predictor.py); returns the cortex.yaml path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(source)
    api = {"name": name, "kind": "RealtimeAPI",
           "predictor": {"type": predictor_type, "path": "predictor.py", **(predictor or {})}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


def wait_until_ready(stack: Stack, api: str, timeout: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Poll `GET /<api>` (what `curl http://host/<api>` shows) until it answers ready; its body."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            answer = requests.get(f"{stack.url}/{api}", timeout=10)
            if answer.status_code == 200 and answer.json().get("ready"):
                return answer.json()
            last = f"{answer.status_code} {answer.text[:500]}"
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(0.2)
    replica_log = Path(stack.data_dir or ".", "logs", f"replica-{api}.log")
    tail = "\n".join(replica_log.read_text(errors="replace").splitlines()[-60:]) if replica_log.exists() else ""
    pytest.fail(f"{api} not ready after {timeout:.0f}s; last answer: {last}\n{tail}")


@pytest.fixture
def serve(client: Client, stack: Stack) -> Iterator[Any]:
    """Deploy a project, wait until it is ready, and delete its APIs after the test."""
    deployed: list[str] = []

    def deploy(cortex_yaml: Path) -> dict[str, Any]:
        names = [api["name"] for api in client.deploy(cortex_yaml)]
        deployed.extend(names)
        return {name: wait_until_ready(stack, name) for name in names}

    yield deploy
    for name in deployed:
        client.delete_api(name, force=True)


def post_json(stack: Stack, path: str, body: Any, **kwargs: Any) -> requests.Response:
    """`curl <url>/<path> -X POST -H "Content-Type: application/json" -d '<body>'`."""
    return requests.post(f"{stack.url}/{path}", json=body, timeout=60, **kwargs)


def versions_served(readiness: dict[str, Any]) -> list[int]:
    return sorted(int(v) for model in readiness["models"] for v in model["versions"])


# -- the shipped examples ------------------------------------------------------------------------------

def copy_example(name: str, destination: Path) -> Path:
    """A copy of examples/<name> without trained models, so tests never write into the repository."""
    target = destination / name
    shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns("models", "__pycache__"))
    return target


@pytest.fixture(scope="module")
def iris_realtime(client: Client, stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """examples/iris-realtime, trained (versions 1 and 2) and deployed; yields its readiness answer."""
    project = copy_example("iris-realtime", tmp_path_factory.mktemp("examples"))
    for version in ("1", "2"):
        subprocess.run([sys.executable, str(project / "train.py"), "--version", version], check=True,
                       capture_output=True)
    client.deploy(project / "cortex.yaml")
    try:
        yield wait_until_ready(stack, "iris-realtime")
    finally:
        client.delete_api("iris-realtime", force=True)


def test_the_iris_realtime_example_reports_both_model_versions_when_ready(iris_realtime):
    assert iris_realtime["ready"] is True
    assert versions_served(iris_realtime) == [1, 2]


def test_the_iris_realtime_example_answers_a_json_body_with_the_label(stack, iris_realtime):
    answers = [post_json(stack, "iris-realtime", flower) for flower in FLOWERS]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.text for a in answers] == LABELS
    assert answers[0].headers["Content-Type"].startswith("text/plain")
    assert answers[0].headers["X-Request-ID"]


def test_the_iris_realtime_example_reads_an_urlencoded_form(stack, iris_realtime):
    # curl -X POST -d "sepal_length=6.4&sepal_width=3.2&petal_length=4.5&petal_width=1.5"
    body = "&".join(f"{name}={value}" for name, value in VERSICOLOR.items())

    answer = requests.post(f"{stack.url}/iris-realtime", data=body, timeout=60,
                           headers={"Content-Type": "application/x-www-form-urlencoded"})

    assert (answer.status_code, answer.text) == (200, "versicolor")


def test_the_iris_realtime_example_reads_a_multipart_form_of_fields_and_files(stack, iris_realtime):
    # curl -X POST -F sepal_length=6.3 -F sepal_width=3.3 -F petal_length=6.0 -F "petal_width=@width.txt"
    fields = {name: (None, str(value)) for name, value in VIRGINICA.items() if name != "petal_width"}
    files = {"petal_width": ("width.txt", b"2.5\n", "text/plain")}

    answer = requests.post(f"{stack.url}/iris-realtime", files={**fields, **files}, timeout=60)

    assert (answer.status_code, answer.text) == (200, "virginica")


def test_the_iris_realtime_example_answers_probabilities_of_the_version_asked_for(stack, iris_realtime):
    latest = post_json(stack, "iris-realtime?probabilities=true", VERSICOLOR).json()
    first = post_json(stack, "iris-realtime?version=1&probabilities=true", VERSICOLOR).json()

    assert latest["label"] == first["label"] == "versicolor"
    assert set(first["probabilities"]) == set(LABELS)
    assert sum(first["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    # version 2 is a decision tree, version 1 a logistic regression: not the same numbers
    assert latest["probabilities"] != first["probabilities"]


def test_the_iris_realtime_example_refuses_what_is_not_a_flower(stack, iris_realtime):
    missing = post_json(stack, "iris-realtime", {"sepal_length": 5.1})
    not_a_number = requests.post(f"{stack.url}/iris-realtime", data={**SETOSA, "petal_width": "wide"}, timeout=60)
    plain_text = requests.post(f"{stack.url}/iris-realtime", data="5.1 3.5 1.4 0.2", timeout=60,
                               headers={"Content-Type": "text/plain"})
    no_such_version = post_json(stack, "iris-realtime?version=9", SETOSA)

    assert missing.status_code == 400
    assert missing.json()["message"] == "missing sepal_width, petal_length, petal_width"
    assert not_a_number.status_code == 400 and "petal_width" in not_a_number.json()["message"]
    assert plain_text.status_code == 400 and plain_text.json()["kind"] == "bad_request"
    assert no_such_version.status_code == 404


@pytest.fixture(scope="module")
def iris_chain(client: Client, stack: Stack, iris_realtime: dict[str, Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """examples/iris-chain deployed next to iris-realtime, which it calls."""
    client.deploy(copy_example("iris-chain", tmp_path_factory.mktemp("examples")) / "cortex.yaml")
    try:
        yield wait_until_ready(stack, "iris-chain")
    finally:
        client.delete_api("iris-chain", force=True)


def test_one_api_calls_another_at_sluice_api_url(stack, iris_chain):
    in_millimetres = {"unit": "mm", "flowers": [{name: value * 10 for name, value in flower.items()}
                                                for flower in (SETOSA, VIRGINICA)]}

    answer = post_json(stack, "iris-chain", in_millimetres, headers={"X-Request-ID": "chained-request-1"})

    assert answer.status_code == 200, answer.text
    assert answer.json() == {"species": ["setosa", "virginica"], "classified_by": "iris-realtime"}
    assert answer.headers["X-Request-ID"] == "chained-request-1"


def test_a_chained_api_refuses_a_bad_flower_before_calling_the_other(stack, iris_chain):
    answer = post_json(stack, "iris-chain", {"flowers": [SETOSA, {**SETOSA, "petal_width": -1}]})

    assert answer.status_code == 400
    assert answer.json()["message"] == "flower 1: petal_width must be a positive number, got -1"


# -- the predictors of Cortex's documents, unchanged --------------------------------------------------

@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_iris

    data = load_iris()
    return data.data.astype(np.float32), data.target


def flower_rows() -> np.ndarray:
    return np.array([[flower[name] for name in FEATURES] for flower in FLOWERS], dtype=np.float32)


@pytest.mark.parametrize("batch_dimension", [None, 1], ids=["batch-of-any-size", "batch-of-one"])
def test_cortexs_onnx_iris_classifier_runs_unchanged(stack, serve, tmp_path, iris, batch_dimension):
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.linear_model import LogisticRegression

    features, target = iris
    model = LogisticRegression(max_iter=1000).fit(features, target)
    # The model's first output is the label array; [1, 4] is how Cortex's own iris model was exported.
    onnx_model = convert_sklearn(model, initial_types=[("input", FloatTensorType([batch_dimension, 4]))],
                                 options={id(model): {"zipmap": False}})
    model_file = tmp_path / "models" / "iris-classifier" / "1" / "model.onnx"
    model_file.parent.mkdir(parents=True)
    model_file.write_bytes(onnx_model.SerializeToString())
    name = f"iris-onnx-{'any' if batch_dimension is None else batch_dimension}"
    ready = serve(write_realtime_project(tmp_path / "project", name, "onnx", CORTEX_ONNX_IRIS,
                                         {"models": {"path": str(model_file.parent.parent)}}))

    answers = [post_json(stack, name, flower) for flower in FLOWERS]

    assert versions_served(ready[name]) == [1]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.text for a in answers] == [LABELS[i] for i in model.predict(flower_rows())]


def save_tensorflow_iris(folder: Path, iris: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """A linear iris classifier as a SavedModel taking each feature by name, as an estimator exported them.

    The `serving_default` signature takes four float inputs of shape [None] and answers
    `class_ids` (one per row) and `probabilities`. Returns the weights (with the bias as last row).
    """
    import tensorflow as tf

    features, target = iris
    x = np.hstack([features, np.ones((len(features), 1), dtype=np.float32)])
    weights, *_ = np.linalg.lstsq(x, np.eye(3)[target], rcond=None)
    weights = weights.astype(np.float32)

    class LinearIris(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = tf.Variable(weights[:4])
            self.bias = tf.Variable(weights[4])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name=name) for name in FEATURES])
        def serve(self, sepal_length, sepal_width, petal_length, petal_width):
            rows = tf.stack([sepal_length, sepal_width, petal_length, petal_width], axis=1)
            scores = tf.matmul(rows, self.weights) + self.bias
            return {"class_ids": tf.argmax(scores, axis=1), "probabilities": tf.nn.softmax(scores)}

    module = LinearIris()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})
    return weights


def test_cortexs_tensorflow_iris_classifier_runs_unchanged(stack, serve, tmp_path, iris):
    models = tmp_path / "models" / "iris-classifier"
    weights = save_tensorflow_iris(models / "1", iris)
    ready = serve(write_realtime_project(tmp_path / "project", "iris-tensorflow", "tensorflow",
                                         CORTEX_TENSORFLOW_IRIS, {"models": {"path": str(models)}}))

    answers = [post_json(stack, "iris-tensorflow", flower) for flower in FLOWERS]

    rows = np.hstack([flower_rows(), np.ones((len(FLOWERS), 1), dtype=np.float32)])
    expected = [LABELS[i] for i in np.argmax(rows @ weights, axis=1)]
    assert versions_served(ready["iris-tensorflow"]) == [1]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.text for a in answers] == expected


def batch_size_figures(stack: Stack, api: str) -> tuple[float, float]:
    """(sum, count) of the stack's `sluice_realtime_batch_size` histogram for one API: calls and runs."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(requests.get(f"{stack.url}/metrics", timeout=30).text):
        if family.name == "sluice_realtime_batch_size":
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[-1]
                if sample.labels.get("api") == api and kind in found:
                    found[kind] = sample.value
    return found["sum"], found["count"]


def test_cortexs_tensorflow_predictor_runs_unchanged_with_server_side_batching(stack, serve, tmp_path, iris):
    """Cortex's one-payload TensorFlowPredictor with `server_side_batching`: its calls are gathered below it.

    On Cortex, TF Serving batched the model's calls and `predict` kept receiving one payload;
    Sluice gathers the concurrent `tensorflow_client.predict` calls of a replica process into
    one run of the signature, and gives each call its own rows back.
    """
    from concurrent.futures import ThreadPoolExecutor

    models = tmp_path / "models" / "iris-classifier"
    weights = save_tensorflow_iris(models / "1", iris)
    api = "iris-tf-batched"
    serve(write_realtime_project(tmp_path / "project", api, "tensorflow", CORTEX_TENSORFLOW_IRIS, {
        "models": {"path": str(models)}, "threads_per_process": 8,
        "server_side_batching": {"max_batch_size": 8, "batch_interval": "200ms"}}))
    features, _ = iris
    picked = features[np.random.default_rng(3).permutation(len(features))[:48]]  # 48 different flowers
    flowers = [{name: float(value) for name, value in zip(FEATURES, row, strict=False)} for row in picked]

    with ThreadPoolExecutor(len(flowers)) as pool:
        answers = list(pool.map(lambda flower: post_json(stack, api, flower), flowers))

    rows = np.hstack([picked, np.ones((len(picked), 1), dtype=np.float32)])
    assert [a.status_code for a in answers] == [200] * len(flowers), answers[0].text
    assert [a.text for a in answers] == [LABELS[i] for i in np.argmax(rows @ weights, axis=1)]
    # Every call was counted in a model run, and runs held several calls (the replica's figures
    # reach /metrics about once a second).
    deadline = time.monotonic() + 30
    while (figures := batch_size_figures(stack, api))[0] < len(flowers) and time.monotonic() < deadline:
        time.sleep(0.2)
    calls, runs = figures
    assert calls == len(flowers)
    assert runs < len(flowers)


def mpg_regressors() -> dict[int, Any]:
    """Three different fitted regressors of miles per gallon, one per model version."""
    from sklearn.linear_model import LinearRegression, Ridge
    from sklearn.tree import DecisionTreeRegressor

    rng = np.random.default_rng(7)
    cars = np.column_stack([
        rng.choice([4, 6, 8], 300), rng.uniform(70, 450, 300), rng.uniform(45, 230, 300),
        rng.uniform(1600, 5100, 300), rng.uniform(8, 25, 300),
    ])
    mpg = 46 - 0.006 * cars[:, 3] - 0.04 * cars[:, 2] + 0.2 * cars[:, 4] + rng.normal(0, 1.5, 300)
    return {
        1: LinearRegression().fit(cars, mpg),
        2: DecisionTreeRegressor(max_depth=4, random_state=0).fit(cars, mpg),
        3: Ridge(alpha=1000.0).fit(cars, mpg),
    }


def save_with_mlflow(model: Any, folder: Path) -> None:
    import mlflow.sklearn

    # cloudpickle, the format MLflow wrote in Cortex's day (MLflow 3 defaults to skops, not installed)
    mlflow.sklearn.save_model(model, str(folder), serialization_format="cloudpickle",
                              pip_requirements=["scikit-learn"])


def test_cortexs_mpg_estimator_serves_the_version_asked_for_and_picks_up_a_new_one(stack, serve, tmp_path):
    regressors = mpg_regressors()
    models = tmp_path / "models" / "mpg-estimator"
    for version in (1, 2):
        save_with_mlflow(regressors[version], models / str(version))
    # Cortex's live-reloading/python/mpg-estimator configuration: models from `multi_model_reloading`.
    ready = serve(write_realtime_project(tmp_path / "project", "mpg-estimator", "python", CORTEX_PYTHON_MPG,
                                         {"multi_model_reloading": {"path": str(models)}}))
    sample = [list(MPG_SAMPLE.values())]

    first = post_json(stack, "mpg-estimator?version=1", MPG_SAMPLE)
    second = post_json(stack, "mpg-estimator?version=2", MPG_SAMPLE)
    latest = post_json(stack, "mpg-estimator", MPG_SAMPLE)

    assert versions_served(ready["mpg-estimator"]) == [1, 2]
    assert first.status_code == second.status_code == latest.status_code == 200
    expected = {version: regressors[version].predict(sample).item() for version in (1, 2)}
    assert first.json() == {"prediction": pytest.approx(expected[1]), "model": {"version": "1"}}
    assert second.json() == {"prediction": pytest.approx(expected[2]), "model": {"version": "2"}}
    assert latest.json() == {"prediction": second.json()["prediction"], "model": {"version": None}}
    assert first.json()["prediction"] != second.json()["prediction"]

    # A new version while the API serves, moved into place whole as an upload to S3 would appear.
    save_with_mlflow(regressors[3], tmp_path / "staging")
    (tmp_path / "staging").rename(models / "3")

    deadline = time.monotonic() + 60
    while (answer := post_json(stack, "mpg-estimator?version=3", MPG_SAMPLE)).status_code != 200:
        assert answer.status_code == 404, answer.text
        assert time.monotonic() < deadline, "version 3 was never picked up"
        time.sleep(0.2)
    assert answer.json()["prediction"] == pytest.approx(regressors[3].predict(sample).item())
    assert post_json(stack, "mpg-estimator", MPG_SAMPLE).json()["prediction"] == answer.json()["prediction"]
