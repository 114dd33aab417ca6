"""An API namespace installed for good (a replica process serving one API): in place for every
thread of the process, even while another namespace is entered. Run in a fresh interpreter, as a
replica runs it; the rest of the namespace is tested fast in tests/unit/test_namespace.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_namespace import api_a, api_b

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


INSTALLED = """
import os, sys, threading
from pathlib import Path
from predictors_runtime.namespace import ApiNamespace

folder, other = Path(sys.argv[1]), Path(sys.argv[2])
namespace = ApiNamespace(folder, {"ONLY_A": "1"})
with namespace.active():
    import helpers
namespace.install()
seen = []

def serve():
    with namespace.active():  # a no-op once installed: safe from many threads
        import helpers
        seen.append((helpers.who(), os.environ.get("ONLY_A"), os.getcwd() == str(folder.resolve())))

threads = [threading.Thread(target=serve) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert seen == [("a", "1", True)] * 8, seen
assert sys.path[0] == str(folder.resolve())
try:
    with ApiNamespace(other, {}).active():
        pass
    namespace_b = ApiNamespace(other, {})
    with namespace_b.active():
        import helpers as b_helpers
        assert b_helpers.who() == "b" and "ONLY_A" not in os.environ
    import helpers as back
    assert back.who() == "a" and os.environ["ONLY_A"] == "1"
except Exception as e:
    raise SystemExit(f"another namespace over an installed one: {e!r}")
print("ok")
"""


def test_an_installed_namespace_stays_in_place_for_every_thread_of_the_process(tmp_path: Path) -> None:
    a, b = api_a(tmp_path), api_b(tmp_path)

    result = subprocess.run(
        [sys.executable, "-c", INSTALLED, str(a.project_dir), str(b.project_dir)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
