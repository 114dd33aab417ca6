"""A front API chained to iris-realtime: validate and normalise, then ask the classifier API.

It takes one flower or a list of them (`{"flowers": [...]}`), in centimetres or millimetres
(`"unit": "mm"`), checks every measurement, converts to centimetres, and calls the API named
in `config["classifier"]` once per flower at `os.environ["SLUICE_API_URL"] + "/<name>"`, the
way a Cortex predictor called `http://api-<name>:8888/predict`. The caller's request id goes
along, so both APIs' log lines of one request carry the same `X-Request-ID`.
"""

import json
import os
import threading

import requests
from werkzeug.wrappers import Response

from foundation.json_logs import logger

FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
TO_CENTIMETRES = {"cm": 1.0, "mm": 0.1}
MAX_FLOWERS = 100


class Invalid(ValueError):
    """The request cannot be classified as sent."""


def _error(status, kind, message):
    return Response(json.dumps({"kind": kind, "message": message}), status=status, mimetype="application/json")


def _header(headers, name):
    """A request header by name, whatever the case of the names in `headers`."""
    for key, value in headers.items():
        if key.lower() == name.lower():
            return value
    return None


def normalise(payload):
    """The flowers of a request as dicts of four positive centimetre values."""
    if not isinstance(payload, dict):
        raise Invalid("send a JSON object: one flower, or {\"flowers\": [...], \"unit\": \"cm\" | \"mm\"}")
    unit = payload.get("unit", "cm")
    if unit not in TO_CENTIMETRES:
        raise Invalid(f"unit must be one of {', '.join(TO_CENTIMETRES)}, not {unit!r}")
    flowers = payload.get("flowers", [payload])
    if not isinstance(flowers, list) or not 1 <= len(flowers) <= MAX_FLOWERS:
        raise Invalid(f"flowers must be a list of 1 to {MAX_FLOWERS} flowers")
    normalised = []
    for index, flower in enumerate(flowers):
        if not isinstance(flower, dict):
            raise Invalid(f"flower {index} is not an object")
        row = {}
        for name in FEATURES:
            value = flower.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise Invalid(f"flower {index}: {name} must be a positive number, got {json.dumps(value)}")
            row[name] = round(value * TO_CENTIMETRES[unit], 4)
        normalised.append(row)
    return normalised


class PythonPredictor:
    def __init__(self, config):
        self.url = os.environ["SLUICE_API_URL"].rstrip("/") + "/" + config.get("classifier", "iris-realtime")
        self.timeout = float(config.get("timeout", 10))
        self._local = threading.local()  # one HTTP session (kept-alive connections) per thread

    def _session(self):
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def predict(self, payload, headers):
        try:
            flowers = normalise(payload)
        except Invalid as e:
            return _error(400, "bad_request", str(e))
        forwarded = {}
        request_id = _header(headers, "X-Request-ID")
        if request_id:
            forwarded["X-Request-ID"] = request_id
        species = []
        for flower in flowers:
            try:
                answer = self._session().post(self.url, json=flower, headers=forwarded, timeout=self.timeout)
            except requests.RequestException as e:
                return _error(502, "upstream_unreachable", f"{self.url}: {e}")
            if answer.status_code != 200:
                # The classifier's own error (503 not ready, 404 not deployed...) goes back as it came.
                return Response(answer.content, status=answer.status_code,
                                content_type=answer.headers.get("Content-Type", "application/json"))
            species.append(answer.text)
        logger.info("classified flowers through another API", extra={"flowers": len(species), "api": self.url})
        return {"species": species, "classified_by": self.url.rsplit("/", 1)[1]}
