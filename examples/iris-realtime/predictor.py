"""An ONNX realtime predictor: the measurements of one iris flower in, its species out.

The body may be JSON (`{"sepal_length": 5.1, ...}`) or a form, url-encoded (`-d a=1&b=2`) or
multipart (`-F a=1`): form values arrive as strings, or as uploaded files, and are read as
numbers here. Query parameters: `version` picks a model version (default the latest), and
`probabilities=true` answers JSON with the class probabilities instead of the bare label.
"""

import json
from collections.abc import Mapping

import numpy as np
from werkzeug.wrappers import Response

from foundation.json_logs import logger

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
LABELS = ["setosa", "versicolor", "virginica"]


class BadMeasurements(ValueError):
    """The request does not hold four usable measurements."""


def _number(name, value):
    if hasattr(value, "read"):  # a form field sent as a file (curl -F "sepal_length=@file")
        value = value.read().decode("utf-8", "replace")
    if isinstance(value, bool):
        raise BadMeasurements(f"{name} must be a number, not {json.dumps(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadMeasurements(f"{name} must be a number, got {value!r}") from None
    if not np.isfinite(number):
        raise BadMeasurements(f"{name} must be a finite number, got {value!r}")
    return number


def measurements(payload):
    """One row of the four features, from a JSON object or a form."""
    if not isinstance(payload, Mapping):
        raise BadMeasurements(
            "send one flower as a JSON object or a form with the fields " + ", ".join(FEATURES)
        )
    missing = [name for name in FEATURES if name not in payload]
    if missing:
        raise BadMeasurements("missing " + ", ".join(missing))
    return [_number(name, payload[name]) for name in FEATURES]


def _bad_request(message):
    body = json.dumps({"kind": "bad_request", "message": message})
    return Response(body, status=400, mimetype="application/json")


class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client = onnx_client

    def predict(self, payload, query_params):
        try:
            row = measurements(payload)
        except BadMeasurements as e:
            return _bad_request(str(e))
        version = query_params.get("version", "latest")
        labels, probabilities = self.client.predict(np.array([row], dtype=np.float32), model_version=version)
        label = LABELS[int(labels[0])]
        logger.info("classified a flower", extra={"label": label, "model_version": version})
        if query_params.get("probabilities", "").lower() in ("1", "true", "yes"):
            return {"label": label, "probabilities": dict(zip(LABELS, probabilities[0].tolist(), strict=False))}
        return label
