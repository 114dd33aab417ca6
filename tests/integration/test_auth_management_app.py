"""API keys where they need real servers: the management app (Flask's test client) on a real
redis-server, and haproxy reading the proxy's configuration with realtime keys.

The rest of the story (keys, binds, the rendered rules) is fast: tests/unit/test_auth.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from api.app import create_app
from foundation.api_keys import header_values
from foundation.settings import Settings
from sluice.haproxy import find_haproxy
from tests.unit.test_auth import KEY, OTHER_KEY, render

pytestmark = pytest.mark.integration


@pytest.fixture
def make_client(redis_server: str, tmp_path: Path):
    """A test client of the management app on database 3 of the session's Redis."""
    url = redis_server.rsplit("/", 1)[0] + "/3"
    redis.Redis.from_url(url).flushdb()

    apps = []

    def make(**settings: Any):
        base = Settings(redis_url=url, storage=str(tmp_path / "storage"), cache_dir=str(tmp_path / "cache"))
        apps.append(create_app(Settings(**{**base.__dict__, **settings})))
        return apps[-1].test_client()

    yield make
    for app in apps:
        app.extensions["sluice.figures"].close()  # while Redis is still there
    redis.Redis.from_url(url).flushdb()


# -- the management API ------------------------------------------------------------------------------
def test_without_keys_every_endpoint_is_open_as_before(make_client):
    client = make_client()
    assert client.get("/apis").status_code == 200
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer wrong-key", f"Basic {KEY}",
                                           f"Bearer {KEY}x", f"Bearer {KEY[:-1]}"])
def test_with_keys_a_request_without_the_right_key_is_refused(make_client, authorization):
    client = make_client(api_keys=(KEY, OTHER_KEY))
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in [("GET", "/apis"), ("POST", "/apis"), ("GET", "/batch/x"), ("GET", "/metrics"),
                         ("GET", "/"), ("DELETE", "/apis/x"), ("GET", "/no/such/path")]:
        answer = client.open(path, method=method, headers=headers)
        assert answer.status_code == 401, (method, path)
        assert answer.get_json()["kind"] == "unauthorized"
        assert answer.get_json()["message"]
        assert answer.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("authorization", [f"Bearer {KEY}", f"bearer {KEY}", f"Bearer {OTHER_KEY}"])
def test_with_keys_a_request_with_a_right_key_is_served(make_client, authorization):
    client = make_client(api_keys=(KEY, OTHER_KEY))
    answer = client.get("/apis", headers={"Authorization": authorization})
    assert answer.status_code == 200, answer.get_json()


def test_an_invoke_key_reads_submits_and_calls_but_cannot_deploy_or_delete(make_client, tmp_path):
    """A keys file handing an application an `invoke` key beside the team's `admin` key."""
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# the team\n{KEY}\n{OTHER_KEY} invoke\n")
    settings = Settings.from_env({"SLUICE_API_KEYS_FILE": str(keys_file)})
    client = make_client(api_keys=settings.api_keys, key_roles=settings.key_roles)
    invoke, admin = {"Authorization": f"Bearer {OTHER_KEY}"}, {"Authorization": f"Bearer {KEY}"}

    assert client.get("/apis", headers=invoke).status_code == 200
    submitted = client.post("/batch/nope", json={"item_list": {"items": [1], "batch_size": 1}}, headers=invoke)
    assert submitted.status_code == 404 and submitted.get_json()["kind"] == "api_not_found"  # allowed, then judged
    for method, path in [("POST", "/apis"), ("DELETE", "/apis/iris")]:
        refused = client.open(path, method=method, headers=invoke)
        assert refused.status_code == 403, (method, path)
        assert refused.get_json()["kind"] == "forbidden"
        assert refused.get_json()["message"].startswith(f"{method} {path} needs an admin key: the key given is an "
                                                        "invoke key")
        assert client.open(path, method=method, headers=admin).status_code != 403  # the admin key goes on


def test_healthz_stays_open_for_probes(make_client):
    client = make_client(api_keys=(KEY,))
    assert client.get("/healthz").status_code == 200


def test_the_api_docs_stay_open_for_browsers(make_client):
    client = make_client(api_keys=(KEY,))
    for path in ("/openapi.json", "/docs", "/docs/assets/swagger-ui-bundle.js"):
        assert client.get(path).status_code == 200, path


def test_realtime_fallback_answers_are_protected_exactly_when_realtime_apis_are(make_client):
    # `/<name>` with no replica is answered by the management API on the realtime API's behalf.
    assert make_client(api_keys=(KEY,)).get("/iris").status_code == 404
    protected = make_client(api_keys=(KEY,), protect_realtime=True)
    assert protected.get("/iris").status_code == 401
    assert protected.get("/iris", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


# -- haproxy reads what the proxy renders ------------------------------------------------------------
def test_haproxy_accepts_the_configuration_with_realtime_keys(tmp_path):
    keys_file = tmp_path / "realtime-keys.lst"
    keys_file.write_text("".join(f"{value}\n" for value in header_values([KEY])))
    checked = tmp_path / "haproxy.cfg"
    checked.write_text(render(str(keys_file)))
    result = subprocess.run([find_haproxy(), "-c", "-q", "-f", str(checked)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr + result.stdout
