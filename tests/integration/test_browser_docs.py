"""A person with a browser at Sluice's public address: a real Chromium (Debian's, headless) loads
`/docs` through the proxy, runs Swagger UI from the files Sluice serves, and lists every operation
of the OpenAPI document. The screenshot it took is kept under `.test-artifacts/`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import requests

from sluice.embedded import Stack

ARTIFACTS = Path(os.environ.get("SLUICE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / ".test-artifacts"))
# What Chromium needs to start headless as root on a machine with no route out: no sandbox, no
# GPU, and none of its own calls home (each would wait on a closed network).
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--hide-scrollbars")


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `make test` installs it (apt-get install chromium)")
    return found


def browse(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Chromium on `url`, given 20 s of virtual time for the page's scripts to run and fetch."""
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000",
         *extra, url],
        capture_output=True, text=True, timeout=120, check=True,
    )


def test_a_browser_at_docs_sees_every_operation_of_the_document(stack: Stack, tmp_path: Path) -> None:
    document = requests.get(f"{stack.url}/openapi.json", timeout=10).json()
    operations = {(method.upper(), path) for path, item in document["paths"].items() for method in item}

    dom = browse(f"{stack.url}/docs", tmp_path, "--dump-dom").stdout

    assert "swagger-ui" in dom and "Failed to load API definition" not in dom, dom[-2000:]
    shown = set(re.findall(
        r'opblock-summary-method">(\w+)</span>.*?data-path="([^"]+)"', dom, flags=re.DOTALL))
    # Swagger UI shows each operation once: method and path, exactly the document's.
    assert shown == operations, (sorted(operations - shown), sorted(shown - operations))
    assert document["info"]["title"] in dom

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "docs.png"
    browse(f"{stack.url}/docs", tmp_path, f"--screenshot={screenshot}", "--window-size=1280,2400")
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_a_browser_at_the_front_page_sees_the_deployed_apis(stack: Stack, tmp_path: Path) -> None:
    dom = browse(f"{stack.url}/", tmp_path, "--dump-dom").stdout
    assert "<h1>Sluice " in dom and 'href="/docs"' in dom
