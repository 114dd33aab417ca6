"""The bundle cache across processes: a bundle that another process holds is never evicted.
The rest of the cache's limits are tested fast in tests/unit/test_input_limits.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from predictors_runtime.bundles import BundleStore
from tests.unit.test_input_limits import project_bundle

pytestmark = pytest.mark.integration


@pytest.fixture
def make_store(tmp_path):
    def make(cache_bytes: int) -> BundleStore:
        return BundleStore(str(tmp_path / "storage"), tmp_path / "cache", cache_bytes=cache_bytes)
    return make


def test_a_bundle_in_use_by_another_process_is_never_evicted(tmp_path, make_store):
    store = make_store(cache_bytes=1)
    a, b = (store.put(project_bundle(tmp_path / n, 50_000)) for n in "ab")
    folder = store.local_folder(a)
    store.release(a)
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import sys; sys.path.insert(0, sys.argv[1])\n"
            "from predictors_runtime.bundles import BundleStore\n"
            "store = BundleStore(sys.argv[2], sys.argv[3])\n"
            "store.local_folder(sys.argv[4])\n"
            "print('holding', flush=True)\n"
            "sys.stdin.read()\n"
        ), str(Path(__file__).resolve().parents[2]), str(tmp_path / "storage"), str(tmp_path / "cache"), a],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"

        store.local_folder(b)

        assert (folder / "predictor.py").is_file()
    finally:
        holder.communicate("", timeout=30)
    assert store.evict() == [a]  # b is still held here
