"""The servers `bench/realtime.py` compares Sluice with, each calling onnxruntime directly.

- `baseline_app()`: a bare Flask app for gunicorn (`bench.realtime_apps:baseline_app()`), the
  baseline: parse the JSON row, run the session, answer the outputs as JSON.
- `BentoService` (in `bench/realtime_bento.py`, which needs BentoML): the same in BentoML.

Both read the model from `BENCH_MODEL` and the feature count from `BENCH_FEATURES`; sessions
use one intra-op thread, as Sluice's replicas do with `OMP_NUM_THREADS=1`.
"""

from __future__ import annotations

import os

import numpy as np


def onnx_session(model_path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


class RowModel:
    """One ONNX session that scores rows given as JSON objects `{"f0": ..., "f1": ...}`."""

    def __init__(self, model_path: str, features: int) -> None:
        self.session = onnx_session(model_path)
        self.input = self.session.get_inputs()[0].name
        self.names = [f"f{i}" for i in range(features)]

    def rows(self, rows: list[dict]) -> list:
        x = np.array([[row[n] for n in self.names] for row in rows], dtype=np.float32)
        return self.session.run(None, {self.input: x})[0].tolist()


def baseline_app():
    from flask import Flask, jsonify, request

    model = RowModel(os.environ["BENCH_MODEL"], int(os.environ["BENCH_FEATURES"]))
    app = Flask("baseline")

    @app.post("/<name>")  # /predict, or an API's own path behind a proxy (bench/proxy_hop.py)
    def predict(name: str):
        return jsonify(model.rows([request.get_json()])[0])

    return app
