"""BentoML serving the bench's ONNX model (`bentoml serve realtime_bento:OnnxService` from bench/).

Runs in its own virtual environment (`bench/requirements-bentoml.lock`): BentoML pins versions of
packages Sluice also uses, so it is kept apart from Sluice's.
"""

from __future__ import annotations

import os
from typing import Any

import bentoml
from realtime_apps import RowModel


@bentoml.service(workers=int(os.environ.get("BENCH_PROCESSES", "2")))
class OnnxService:
    def __init__(self) -> None:
        self.model = RowModel(os.environ["BENCH_MODEL"], int(os.environ["BENCH_FEATURES"]))

    @bentoml.api
    def predict(self, row: dict) -> Any:  # a label (iris) or a list of scores (mlp)
        return self.model.rows([row])[0]
