"""A person with a browser at Sluice's public address: a real Chromium (Debian's, headless) loads
`/docs` through the proxy, runs Swagger UI from the files Sluice serves, and lists every operation
of the OpenAPI document. The screenshot it took is kept under `.test-artifacts/`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
from PIL import Image

from foundation.api_status import realtime_status
from sluice.client import Client
from sluice.embedded import Stack
from tests.integration.test_realtime import write_realtime_project

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


BROKEN_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config):
        raise RuntimeError("the model file is missing: /models/a-rather-long-path/that/goes/on/and/on/" + "x" * 200)

    def predict(self, payload):
        return payload
'''


def test_at_1280_px_the_front_page_shows_each_apis_status_and_nothing_overflows(
        stack: Stack, client: Client, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    broken, good = f"broken-{suffix}", f"a-realtime-api-with-a-long-descriptive-name-{suffix}"
    client.deploy(write_realtime_project(tmp_path / broken, broken, source=BROKEN_PREDICTOR))
    client.deploy(write_realtime_project(tmp_path / good, good))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (
                realtime_status_of(client, broken) != "error" or realtime_status_of(client, good) != "live"):
            time.sleep(0.2)

        dom = browse(f"{stack.url}/", tmp_path, "--dump-dom", "--window-size=1280,1000").stdout
        assert shown_status(dom, broken) == "error" and shown_status(dom, good) == "live"
        broken_row = dom.split(f'id="api-{broken}"', 1)[1].split("</tr>", 1)[0]
        assert re.search(r"<summary>[^<]*RuntimeError: the model file is missing", broken_row)  # the rest folded

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        screenshot = ARTIFACTS / "front-page-1280.png"
        browse(f"{stack.url}/", tmp_path, f"--screenshot={screenshot}", "--window-size=1280,1000")
        with Image.open(screenshot) as image:
            assert image.width == 1280
            gray = image.convert("L")
            inked = [x for x in range(gray.width) if gray.crop((x, 0, x + 1, gray.height)).getextrema()[0] < 200]
        # The page is centred with a margin on each side: nothing of it reaches the right edge.
        assert inked and max(inked) < 1280 - 32, f"the page reaches x={max(inked)} at 1280 px: see {screenshot}"
    finally:
        client.delete_api(broken, force=True)
        client.delete_api(good, force=True)


def realtime_status_of(client: Client, name: str) -> str:
    api = client.api(name)
    return realtime_status(api["bundle"], api.get("replicas", []))


def shown_status(dom: str, name: str) -> str:
    row = dom.split(f'id="api-{name}"', 1)[1].split("</tr>", 1)[0]
    return re.search(r'<td class="status[^"]*">\s*([^<]+?)\s*</td>', row).group(1)  # type: ignore[union-attr]
