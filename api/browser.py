"""What a browser finds at Sluice's public address: a front page and the HTTP API's docs.

`GET /` names the deployed APIs with their links; `GET /docs` is Swagger UI over `/openapi.json`.
Swagger UI's files come from the `swagger-ui-py` distribution, installed with the server, and are
served from here: the page works on a machine with no route to a CDN.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from flask import Blueprint, Response, abort, render_template_string, send_from_directory

from foundation.version import sluice_version

from .apis import view_of
from .context import registry

blueprint = Blueprint("browser", __name__)

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets/"
# The files the docs page loads: nothing else of the distribution's folder is served.
ASSETS = frozenset({"swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png", "favicon-16x16.png"})


def assets_folder() -> Path:
    """Swagger UI's built files inside the installed `swagger_ui` package."""
    return Path(str(resources.files("swagger_ui"))) / "static"


_DOCS_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Sluice {{ version }}: HTTP API</title>
  <link rel="stylesheet" href="{{ assets }}swagger-ui.css">
  <link rel="icon" type="image/png" href="{{ assets }}favicon-32x32.png" sizes="32x32">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{{ assets }}swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
                                 displayRequestDuration: true});
  </script>
</body>
</html>
"""

_FRONT_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Sluice {{ version }}</title>
  <style>
    body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 56rem; padding: 0 1rem; }
    table { border-collapse: collapse; width: 100%; }
    th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #ddd; }
    .error { color: #b00020; }
  </style>
</head>
<body>
  <h1>Sluice {{ version }}</h1>
  <p>
    <a href="/docs">HTTP API docs</a> &middot; <a href="/openapi.json">OpenAPI document</a> &middot;
    <a href="/metrics">metrics</a> &middot; <a href="/healthz">health</a> &middot;
    <a href="/apis">APIs as JSON</a>
  </p>
  <h2>Deployed APIs</h2>
  {% if apis %}
  <table>
    <tr><th>name</th><th>kind</th><th>endpoint</th><th>details</th></tr>
    {% for api in apis %}
    <tr class="api">
      <td>{{ api.name }}</td>
      <td>{{ api.kind }}</td>
      <td><code>/{{ api.name }}</code></td>
      <td><a href="/apis/{{ api.name }}">/apis/{{ api.name }}</a>
        {% if api.build_error %}<div class="error">error: {{ api.build_error.message }}</div>{% endif %}
        {% if api.environment and api.environment.error %}
        <div class="error">environment failed: {{ api.environment.error }}</div>{% endif %}</td>
    </tr>
    {% endfor %}
  </table>
  {% else %}
  <p id="no-apis">No APIs are deployed. Deploy a project with <code>sluice deploy cortex.yaml</code>.</p>
  {% endif %}
</body>
</html>
"""


@blueprint.get("/")
def front_page() -> str:
    """The deployed APIs, each with its endpoint, its details and the error of a failed build."""
    apis = [view_of(api, states=True) for api in sorted(registry().all(), key=lambda a: a.name)]
    return render_template_string(_FRONT_PAGE, version=sluice_version(), apis=apis)


@blueprint.get(DOCS_PATH)
def docs_page() -> str:
    """Swagger UI over this Sluice's OpenAPI document."""
    return render_template_string(_DOCS_PAGE, version=sluice_version(), assets=ASSETS_PATH)


@blueprint.get(ASSETS_PATH + "<filename>")
def docs_asset(filename: str) -> Response:
    """One of Swagger UI's files; they change only with the installed distribution."""
    if filename not in ASSETS:
        abort(404)
    return send_from_directory(assets_folder(), filename, max_age=3600)
