"""API keys: the management API asks for one when keys are set, the proxy asks realtime callers
for one when the operator says so, and nothing listens beyond loopback anonymously by accident.

Fast: keys, binds and the proxy's rendered configuration. The management app on a real Redis and
`haproxy -c` reading the configuration are in tests/integration/test_auth_management_app.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from foundation.api_keys import (
    header_values,
    key_matches,
    load_api_keys,
    parse_keys_file,
    presented_key,
    refuse_open_bind,
)
from foundation.api_registry import DeployedApi
from foundation.errors import ConfigError, InsecureBind
from foundation.replica_directory import ReplicaRecord
from foundation.settings import Settings
from predictors_runtime.config import ApiConfig
from sluice.client import Client
from sluice.proxy import ProxyController
from sluice.proxy_config import plan_routes, render_config

KEY = "k-3f9a1c27e8b44d0f"
OTHER_KEY = "k-second-7b21"


# The management app's answers with and without keys (it needs Redis) are in
# tests/integration/test_auth_management_app.py.
def test_the_client_sends_its_key(monkeypatch):
    monkeypatch.setenv("SLUICE_API_KEY", KEY)
    assert Client("http://127.0.0.1:1")._session.headers["Authorization"] == f"Bearer {KEY}"
    assert Client("http://127.0.0.1:1", api_key=OTHER_KEY)._session.headers["Authorization"] == f"Bearer {OTHER_KEY}"
    monkeypatch.delenv("SLUICE_API_KEY")
    assert "Authorization" not in Client("http://127.0.0.1:1")._session.headers


# -- reading keys ------------------------------------------------------------------------------------
def test_keys_come_from_the_variable_and_the_file_without_blanks_comments_or_repeats(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# operators\n\n  {OTHER_KEY}  \n#{KEY}-commented-out\n{KEY}\n")
    env = {"SLUICE_API_KEYS": f" {KEY}, ,k-third", "SLUICE_API_KEYS_FILE": str(keys_file)}
    assert load_api_keys(env) == (KEY, "k-third", OTHER_KEY)
    assert Settings.from_env(env).api_keys == (KEY, "k-third", OTHER_KEY)
    assert Settings.from_env({}).api_keys == ()


def test_a_keys_file_line_may_name_its_role_and_a_bare_key_or_the_variables_is_admin(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"{KEY}\n{OTHER_KEY}   invoke\n# k-x invoke\nk-third admin\n")
    settings = Settings.from_env({"SLUICE_API_KEYS": "k-var", "SLUICE_API_KEYS_FILE": str(keys_file)})
    assert dict(settings.key_roles) == {"k-var": "admin", KEY: "admin", OTHER_KEY: "invoke", "k-third": "admin"}
    assert settings.api_keys == ("k-var", KEY, OTHER_KEY, "k-third")
    keys_file.write_text(f"{KEY} owner\n")
    with pytest.raises(ConfigError, match="line 1: unknown role 'owner' \\(roles: admin, invoke\\)"):
        Settings.from_env({"SLUICE_API_KEYS_FILE": str(keys_file)})
    assert KEY not in repr(settings) and OTHER_KEY not in repr(settings)


def test_only_changes_to_apis_need_an_admin_key():
    from foundation.api_keys import needs_admin

    assert needs_admin("POST", "/apis") and needs_admin("DELETE", "/apis/iris") and needs_admin("PUT", "/apis/x")
    assert not needs_admin("GET", "/apis") and not needs_admin("GET", "/apis/iris")
    assert not needs_admin("POST", "/batch/iris") and not needs_admin("DELETE", "/batch/iris")
    assert not needs_admin("POST", "/iris") and not needs_admin("POST", "/tasks/t")


def test_keys_never_appear_in_the_settings_repr():
    assert KEY not in repr(Settings.from_env({"SLUICE_API_KEYS": KEY}))


def test_an_unreadable_keys_file_stops_the_start_rather_than_opening_sluice(tmp_path):
    with pytest.raises(ConfigError, match="SLUICE_API_KEYS_FILE"):
        load_api_keys({"SLUICE_API_KEYS_FILE": str(tmp_path / "missing")})


@pytest.mark.parametrize("bad", ["two words", "tab\tkey", "caf\u00e9", "nul\x00key"])
def test_a_key_haproxy_or_http_could_not_carry_is_refused(bad):
    with pytest.raises(ConfigError):
        parse_keys_file(bad)
    with pytest.raises(ConfigError):
        load_api_keys({"SLUICE_API_KEYS": bad})


def test_the_bearer_scheme_is_read_in_any_case_and_keys_compare_whole():
    assert presented_key(f"Bearer {KEY}") == presented_key(f"BEARER  {KEY}") == KEY
    assert presented_key(f"Basic {KEY}") is None and presented_key("Bearer ") is None
    assert key_matches(KEY, [OTHER_KEY, KEY]) and not key_matches(KEY[:-1], [KEY])
    assert not key_matches(KEY, [])


# -- listening beyond loopback -----------------------------------------------------------------------
@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.0.0.7", "sluice-host"])
def test_a_public_bind_without_keys_is_refused_naming_the_variables(bind):
    with pytest.raises(InsecureBind) as refused:
        refuse_open_bind(bind, Settings())
    for variable in ("SLUICE_API_KEYS", "SLUICE_API_KEYS_FILE", "SLUICE_ALLOW_ANONYMOUS"):
        assert variable in str(refused.value)


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "10.0.0.7"])
def test_a_public_bind_is_allowed_with_keys_or_when_anonymous_callers_are_accepted(bind):
    refuse_open_bind(bind, Settings(api_keys=(KEY,)))
    refuse_open_bind(bind, Settings.from_env({"SLUICE_ALLOW_ANONYMOUS": "1"}))


@pytest.mark.parametrize("bind", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_keys(bind):
    refuse_open_bind(bind, Settings())


class Untouched:
    """Stands in for the proxy's Redis client where nothing may reach Redis: any use fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"Redis was used ({name}) where nothing should reach it")


def test_the_proxy_refuses_to_start_on_a_public_address_without_keys(tmp_path):
    controller = ProxyController(Untouched(), port=1, bind="0.0.0.0",  # type: ignore[arg-type]
                                 management="127.0.0.1:2", state_dir=tmp_path / "proxy", settings=Settings())
    try:
        with pytest.raises(InsecureBind, match="SLUICE_ALLOW_ANONYMOUS"):
            controller.start()  # before haproxy starts, and before Redis is asked anything
        assert not controller.haproxy.alive()
    finally:
        controller.haproxy.close()


def test_the_proxy_refuses_to_protect_realtime_apis_without_keys(tmp_path):
    controller = ProxyController(Untouched(), port=1, management="127.0.0.1:2",  # type: ignore[arg-type]
                                 state_dir=tmp_path / "proxy", settings=Settings(protect_realtime=True))
    try:
        with pytest.raises(ConfigError, match="SLUICE_API_KEYS"):
            controller.start()
        assert not controller.haproxy.alive()
    finally:
        controller.haproxy.close()


# -- the proxy's configuration -----------------------------------------------------------------------
def render(keys_file: str | None) -> str:
    """The configuration of one realtime API with one ready replica (`keys_file`: realtime keys wanted)."""
    config = ApiConfig.from_dict({"name": "iris", "kind": "RealtimeAPI", "predictor": {"path": "predictor.py"}})
    api = DeployedApi(name="iris", kind="RealtimeAPI", spec=config.to_dict(), bundle="b1", queue=config.queue,
                      deployed_at=0.0, ignored_fields=[])
    record = ReplicaRecord(replica_id="iris-1", api="iris", bundle="b1", host="127.0.0.1", port=9001, processes=1,
                           ready=True, draining=False, seen=1000.0)
    return render_config(plan_routes([api], [record]), bind="127.0.0.1", port=8888, management="127.0.0.1:9100",
                         keys_file=keys_file)


def _backend(config: str, header: str) -> list[str]:
    lines, inside = [], False
    for line in config.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == header
        elif inside:
            lines.append(line.strip())
    return lines


def test_with_realtime_protection_each_realtime_backend_checks_the_key_first_and_drops_it(tmp_path):
    keys_file = tmp_path / "realtime-keys.lst"
    keys_file.write_text("".join(f"{value}\n" for value in header_values([KEY])))
    config = render(str(keys_file))  # haproxy reads it: tests/integration/test_auth_management_app.py

    backend = _backend(config, "backend rt_iris")
    assert backend[backend.index("http-request track-sc0 str(iris) table sluice_rejected") + 1].startswith(
        "http-request return status 401")  # tracked (to count refusals) first, then nothing before the check
    rules = [line for line in backend if line.startswith("http-request ") and "track-sc0" not in line]
    assert rules[0].startswith("http-request return status 401 content-type application/json ")
    assert 'kind\\": \\"unauthorized' in rules[0]
    assert "hdr WWW-Authenticate Bearer" in rules[0]
    assert rules[0].endswith(f'unless {{ req.fhdr(authorization) -m str -f "{keys_file}" }}')
    assert rules[1] == "http-request del-header Authorization"  # predictors never see the key
    # The management API checks keys itself: nothing of the kind in its path.
    assert "authorization" not in "\n".join(_backend(config, "backend management")).lower()
    assert "authorization" not in "\n".join(_backend(config, "frontend public")).lower()


def test_without_realtime_protection_realtime_backends_check_nothing():
    assert "authorization" not in render(None).lower()


def test_the_proxy_writes_the_accepted_headers_readable_by_its_user_only(tmp_path):
    controller = ProxyController(Untouched(), port=1, management="127.0.0.1:2",  # type: ignore[arg-type]
                                 state_dir=tmp_path / "proxy",
                                 settings=Settings(api_keys=(KEY, OTHER_KEY), protect_realtime=True))
    controller._write_keys_file()
    assert controller.keys_file is not None
    assert controller.keys_file.read_text().splitlines() == [
        f"Bearer {KEY}", f"bearer {KEY}", f"Bearer {OTHER_KEY}", f"bearer {OTHER_KEY}"]
    assert controller.keys_file.stat().st_mode & 0o077 == 0
    controller.haproxy.close()


class _ArrivedOn:
    """What gunicorn puts in the environ as `gunicorn.socket`: here only its local address matters."""

    def __init__(self, address: Any) -> None:
        self.address = address

    def getsockname(self) -> Any:
        return self.address


@pytest.mark.parametrize("local, allowed", [
    (("10.0.0.5", 8888), False),
    (("0.0.0.0", 8888), False),
    (("127.0.0.1", 8888), True),
    (("::1", 8888, 0, 0), True),
    ("/tmp/sluice.sock", True),  # a Unix socket
])
def test_without_keys_a_request_arriving_on_a_public_address_is_refused(local: Any, allowed: bool) -> None:
    from flask import Flask

    from api.auth import request_guard

    app = Flask("t")
    app.before_request(request_guard(Settings()))
    app.add_url_rule("/apis", "apis", lambda: "ok")
    app.add_url_rule("/healthz", "healthz", lambda: "ok")
    client = app.test_client()
    answer = client.get("/apis", environ_base={"gunicorn.socket": _ArrivedOn(local)})
    assert (answer.status_code == 200) is allowed, answer.get_data(as_text=True)
    if not allowed:
        assert answer.status_code == 403 and answer.get_json()["kind"] == "insecure_bind"
        assert "SLUICE_API_KEYS" in answer.get_json()["message"]
    # Probes stay open, and the operator may accept anonymous callers.
    assert client.get("/healthz", environ_base={"gunicorn.socket": _ArrivedOn(local)}).status_code == 200
    anonymous = Flask("anonymous")
    anonymous.before_request(request_guard(Settings(allow_anonymous=True)))
    anonymous.add_url_rule("/apis", "apis", lambda: "ok")
    assert anonymous.test_client().get("/apis", environ_base={"gunicorn.socket": _ArrivedOn(local)}).status_code == 200
