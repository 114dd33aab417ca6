"""Reloading a model many times must not grow the process: every reference to a replaced model goes."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

from predictors_runtime.config import ModelsConfig
from predictors_runtime.models import ModelManager

MODEL_BYTES = 20 * 1024 * 1024
RELOADS = 30


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_reloading_a_big_model_many_times_frees_the_replaced_ones(tmp_path: Path) -> None:
    root = tmp_path / "store" / "big"
    (root / "1").mkdir(parents=True)
    alive: list[weakref.ref[np.ndarray]] = []

    def load(path: Path) -> np.ndarray:
        fill = len((path / "weights.txt").read_bytes())
        array = np.full(MODEL_BYTES // 8, float(fill))  # written, so its pages count in RSS
        alive.append(weakref.ref(array))
        return array

    (root / "1" / "weights.txt").write_bytes(b"w")
    manager = ModelManager(ModelsConfig(path=str(root)), "python", tmp_path / "cache", load)
    assert manager.get().model[0] == 1.0
    gc.collect()
    baseline = rss_bytes()
    for i in range(2, RELOADS + 2):
        (root / "1" / "weights.txt").write_bytes(b"w" * i)  # a new size: a change any clock notices
        lines = manager.poll_once(float(i))
        assert lines == ["model: version 1 changed", "model: version 1 loaded"], lines
        assert manager.get().model[0] == float(i)
    gc.collect()
    growth = rss_bytes() - baseline
    assert sum(ref() is not None for ref in alive) == 1  # only the model served now
    assert growth < 3 * MODEL_BYTES, f"RSS grew by {growth / 2**20:.1f} MiB over {RELOADS} reloads"
    assert len(list((tmp_path / "cache" / "_default").iterdir())) == 1  # replaced folders are deleted
