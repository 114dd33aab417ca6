"""What a browser finds at Sluice's address: the front page names the deployed APIs, `/docs` is
Swagger UI from files served here (no CDN), and both the docs and the document open without a key.

(The docs rendered by a real browser: tests/integration/test_browser_docs.py.)"""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from api import context
from api.auth import is_open_path
from api.browser import ASSETS, assets_folder
from foundation.memory import MemoryApiRegistry, MemoryPredictorBuilds
from foundation.replica_directory import ReplicaRecord
from foundation.settings import Settings
from foundation.version import sluice_version
from jobs.services import Services
from predictors_runtime.config import ApiConfig, ConfigError
from tests.unit.test_batch_api import API, app_of, services  # noqa: F401  (services: a fixture)


class Links(HTMLParser):
    """Every href and src of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found += [value for name, value in attrs if name in ("href", "src") and value]


def links_of(page: str) -> list[str]:
    parser = Links()
    parser.feed(page)
    return parser.found


@pytest.fixture
def app(services: Services) -> Flask:  # noqa: F811
    registry = MemoryApiRegistry()
    registry.put(ApiConfig.from_dict(API), "sha256-abc")
    registry.put(ApiConfig.from_dict({**API, "name": "text-generator"}), "sha256-def")
    return app_of(services, registry)


def test_the_front_page_names_each_deployed_api_with_its_links(app: Flask) -> None:
    page = app.test_client().get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert f"Sluice {sluice_version()}" in text
    assert re.findall(r"<tr class=\"api\" id=\"api-[^\"]+\">\s*<td>([^<]+)</td>", text) == ["iris", "text-generator"]
    links = links_of(text)
    assert {"/docs", "/openapi.json", "/metrics", "/healthz", "/apis/iris", "/apis/text-generator"} <= set(links)
    assert {"/iris", "/text-generator"} <= set(links)  # each endpoint is a link


def test_every_link_of_the_front_page_answers(app: Flask) -> None:
    client = app.test_client()
    for link in links_of(client.get("/").get_data(as_text=True)):
        if link in ("/healthz", "/metrics"):  # these read Redis, which this tier has none of
            continue
        assert client.get(link).status_code == 200, link


def test_an_api_whose_build_failed_shows_its_error_on_the_front_page(app: Flask) -> None:
    builds = MemoryPredictorBuilds()
    builds.failed("iris", "sha256-abc", "predictor.py line 3: NameError: name 'np' is not defined <script>")
    app.extensions[context.PREDICTOR_BUILDS] = builds
    text = app.test_client().get("/").get_data(as_text=True)
    assert "building the predictor failed: predictor.py line 3: NameError: name &#39;np&#39; is not defined " \
           "&lt;script&gt;" in text
    assert status_of(text, "iris") == "error" and status_of(text, "text-generator") == "live"


def status_of(page: str, name: str) -> str:
    """What the status column of `name`'s row says."""
    row = page.split(f'id="api-{name}"', 1)[1].split("</tr>", 1)[0]
    return re.search(r'<td class="status[^"]*">\s*([^<]+?)\s*</td>', row).group(1)  # type: ignore[union-attr]


def test_a_build_traceback_shows_the_exception_it_ended_with_and_unfolds_to_the_whole(app: Flask) -> None:
    traceback = ("Traceback (most recent call last):\n  File \"predictor.py\", line 9, in __init__\n"
                 "    self.model = load(config['model'])\nKeyError: 'model'")
    builds = MemoryPredictorBuilds()
    builds.failed("iris", "sha256-abc", traceback)
    app.extensions[context.PREDICTOR_BUILDS] = builds

    row = app.test_client().get("/").get_data(as_text=True).split('id="api-iris"', 1)[1].split("</tr>", 1)[0]

    summary = re.search(r"<summary>([^<]*)</summary>", row).group(1)  # type: ignore[union-attr]
    assert summary == "building the predictor failed: KeyError: &#39;model&#39;"
    assert "line 9, in __init__" in row.split("<pre>", 1)[1]  # the whole of it, folded away


def test_a_realtime_api_is_starting_until_a_replica_is_ready_and_an_error_only_when_one_fails(
        services: Services) -> None:  # noqa: F811
    registry = MemoryApiRegistry()
    deployed = registry.put(ApiConfig.from_dict({"name": "rt", "kind": "RealtimeAPI",
                                                 "predictor": {"type": "python", "path": "predictor.py"}}), "b1")
    app = app_of(services, registry)
    replicas = app.extensions[context.REPLICAS]

    def show(**record: Any) -> tuple[str, str]:
        replicas.announce(ReplicaRecord("rt-1", "rt", deployed.bundle, "127.0.0.1", 9000, 1, draining=False,
                                        seen=time.time(), **record))
        page = app.test_client().get("/").get_data(as_text=True)
        return status_of(page, "rt"), page.split('id="api-rt"', 1)[1].split("</tr>", 1)[0]

    starting, row = show(ready=False, message="building its environment env-1: installing 3 packages")
    assert starting == "starting" and "building its environment env-1" in row
    assert show(ready=True)[0] == "live"
    failing, row = show(ready=False, message="gunicorn exited with status 3; restarting", failing=True)
    assert failing == "error" and "status-error" in row

def test_with_nothing_deployed_the_front_page_says_how_to_deploy(services: Services) -> None:  # noqa: F811
    text = app_of(services, MemoryApiRegistry()).test_client().get("/").get_data(as_text=True)
    assert "No APIs are deployed" in text and "sluice deploy" in text


def test_the_docs_page_loads_swagger_ui_from_this_server_only(app: Flask) -> None:
    client = app.test_client()
    page = client.get("/docs")
    assert page.status_code == 200 and page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert 'url: "/openapi.json"' in text
    links = links_of(text)
    assert links and all(link.startswith("/docs/assets/") for link in links), links  # nothing from elsewhere
    for link in links:
        asset = client.get(link)
        assert asset.status_code == 200 and len(asset.get_data()) > 1000, link
    assert "SwaggerUIBundle" in client.get("/docs/assets/swagger-ui-bundle.js").get_data(as_text=True)


def test_only_the_pages_files_are_served_from_the_assets_folder(app: Flask) -> None:
    client = app.test_client()
    assert {path.name for path in Path(assets_folder()).iterdir()} > ASSETS  # the distribution has more
    for name in ("swagger-editor-bundle.js", "..%2F__init__.py", "index.html"):
        assert client.get(f"/docs/assets/{name}").status_code == 404


def test_the_docs_and_the_document_open_without_a_key_the_front_page_does_not(services: Services) -> None:  # noqa: F811
    services.settings = Settings(storage=services.settings.storage, api_keys=("a-key-of-the-team",))
    client = app_of(services, MemoryApiRegistry()).test_client()
    for path in ("/docs", "/docs/assets/swagger-ui.css", "/openapi.json"):
        assert client.get(path).status_code == 200, path
    assert client.get("/").status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer a-key-of-the-team"}).status_code == 200
    assert not is_open_path("/docsx") and not is_open_path("/apis")


def test_docs_is_a_reserved_api_name() -> None:
    with pytest.raises(ConfigError, match="'docs' is reserved"):
        ApiConfig.from_dict({**API, "name": "docs"})
