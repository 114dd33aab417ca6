"""What a browser finds at Sluice's public address: a front page and the HTTP API's docs.

`GET /` names the deployed APIs with their links; `GET /docs` is Swagger UI over `/openapi.json`.
Swagger UI's files come from the `swagger-ui-py` distribution, installed with the server, and are
served from here: the page works on a machine with no route to a CDN.
"""

from __future__ import annotations

import textwrap
import time
from importlib import resources
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, abort, render_template_string, send_from_directory

from foundation.api_kinds import ApiKind
from foundation.api_status import api_status, failure_of
from foundation.errors import summary_line
from foundation.version import sluice_version

from .apis import replicas_of, view_of
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

# What a failure shows before it is unfolded: the rest is one click away.
SUMMARY_CHARACTERS = 160

_FRONT_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Sluice {{ version }}</title>
  <style>
    body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; padding: 0 1rem; }
    table { border-collapse: collapse; width: 100%; table-layout: fixed; }
    th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #ddd; vertical-align: top;
             overflow-wrap: anywhere; }
    th.name { width: 22%; } th.kind { width: 12%; } th.status { width: 14%; } th.endpoint { width: 22%; }
    .status { font-weight: 600; }
    .status-live { color: #1b5e20; } .status-error { color: #b00020; }
    .status-starting, .status-updating, .status-no-replicas, .status-live-with-errors { color: #8a5300; }
    .error { color: #b00020; }
    details pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: .8rem; max-height: 20rem;
                  overflow: auto; background: #f6f6f6; padding: .4rem; }
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
    <tr><th class="name">name</th><th class="kind">kind</th><th class="status">status</th>
        <th class="endpoint">endpoint</th><th>details</th></tr>
    {% for api in apis %}
    <tr class="api" id="api-{{ api.name }}">
      <td>{{ api.name }}</td>
      <td>{{ api.kind }}</td>
      <td class="status status-{{ api.status | replace(' (', '-') | replace(')', '') | replace(' ', '-') }}">
        {{ api.status }}</td>
      <td><a href="/{{ api.name }}"><code>/{{ api.name }}</code></a></td>
      <td><a href="/apis/{{ api.name }}">/apis/{{ api.name }}</a>
        {% if api.failure %}
        <details class="error"><summary>{{ api.failure_line }}</summary><pre>{{ api.failure }}</pre></details>
        {% elif api.note %}<div>{{ api.note }}</div>{% endif %}</td>
    </tr>
    {% endfor %}
  </table>
  {% else %}
  <p id="no-apis">No APIs are deployed. Deploy a project with <code>sluice deploy cortex.yaml</code>.</p>
  {% endif %}
</body>
</html>
"""


def front_row(view: dict[str, Any], replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """One API's row: its status in a word (as `sluice get` says it), what failed (its first line, the
    whole text to unfold: a build error is a traceback), or why a realtime API is not ready yet."""
    failure = failure_of(view) or next((r["message"] for r in replicas if r.get("failing")), None)
    row = {**view, "status": api_status(view, replicas), "failure": failure}
    if failure is not None:
        row["failure_line"] = textwrap.shorten(summary_line(failure), SUMMARY_CHARACTERS, placeholder=" ...")
    else:
        notes = [r["message"] for r in replicas if r.get("message") and not r.get("ready")]
        row["note"] = summary_line(notes[0]) if notes else ""
    return row


@blueprint.get("/")
def front_page() -> str:
    """The deployed APIs, each with its status, its endpoint, its details and what failed, if anything."""
    now = time.time()
    apis = [front_row(view_of(api, states=True), replicas_of(api, now) if api.kind == ApiKind.REALTIME else [])
            for api in sorted(registry().all(), key=lambda a: a.name)]
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
