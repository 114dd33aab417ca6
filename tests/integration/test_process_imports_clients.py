"""In a fresh interpreter, importing the model clients imports neither onnxruntime nor TensorFlow
(each is imported only by the predictor type that needs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_clients_imports_neither_onnxruntime_nor_tensorflow() -> None:
    code = (
        "import sys, predictors_runtime.clients\n"
        "print(sorted(m for m in ('onnxruntime', 'tensorflow') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})

    assert out.stdout.strip() == "[]"
