"""haproxy reads every configuration the proxy renders: each test of tests/unit/test_proxy_config.py
that renders one runs again here, with `haproxy -c` as its check, so a rule haproxy 2.6 cannot
read fails here rather than at the first reload."""

from __future__ import annotations

import inspect
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.haproxy import find_haproxy
from tests.unit import test_proxy_config as rendering

pytestmark = pytest.mark.integration

RENDERING_TESTS = [test for name, test in sorted(vars(rendering).items())
                   if name.startswith("test_") and "haproxy_accepts" in inspect.signature(test).parameters]


@pytest.fixture
def haproxy_accepts(tmp_path: Path) -> Callable[[str], None]:
    def check(config: str) -> None:
        rendering.haproxy_layout(config)
        path = tmp_path / "haproxy.cfg"
        path.write_text(config)
        result = subprocess.run([find_haproxy(), "-c", "-q", "-f", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr + result.stdout
    return check


def test_every_rendering_test_is_run_here() -> None:
    assert len(RENDERING_TESTS) >= 10
    assert all(list(inspect.signature(test).parameters) == ["haproxy_accepts"] for test in RENDERING_TESTS)


@pytest.mark.parametrize("rendering_test", RENDERING_TESTS, ids=lambda test: test.__name__.removeprefix("test_"))
def test_haproxy_accepts_what_the_proxy_renders(rendering_test: Callable[..., Any], haproxy_accepts) -> None:
    rendering_test(haproxy_accepts)
