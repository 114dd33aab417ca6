"""The compose files are valid Compose files: checked against the Compose Specification's JSON
schema (vendored in tests/data, see its README). `docker compose config`, which also merges the
files, interpolates the variables and applies the profiles, checks them where docker is installed:
tests/integration/test_compose_docker.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
# compose.yaml runs everything on one host; compose.hosts.yaml is laid over it on host A when
# workers and replicas run on other hosts too.
COMPOSE_FILES = ("compose.yaml", "compose.hosts.yaml")
# What compose.hosts.yaml wants besides the example env file's secrets.
HOSTS_VARIABLES = {"SLUICE_STORAGE": "s3://sluice-bundles/sluice", "SLUICE_REDIS_PUBLISH": "10.0.0.5"}


@functools.cache
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def problems(document: Any) -> list[str]:
    return [f"{error.json_path}: {error.message}" for error in validator().iter_errors(document)]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_the_compose_file_follows_the_compose_specification(name: str) -> None:
    document = yaml.safe_load((DOCKER / name).read_text())
    assert problems(document) == []


def test_the_schema_check_catches_a_misspelt_or_misplaced_field() -> None:
    document = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    service = next(iter(document["services"]))
    misspelt = {**document, "services": {**document["services"], service: {
        **document["services"][service], "restrat": "always"}}}
    wrong_type = {**document, "services": {**document["services"], service: {
        **document["services"][service], "ports": "8888:8888"}}}
    assert any("restrat" in problem for problem in problems(misspelt))
    assert any("ports" in problem for problem in problems(wrong_type))


def test_the_hosts_file_overrides_services_of_compose_yaml_and_every_one_from_sluices_image() -> None:
    """Laid over compose.yaml, a service it names but compose.yaml lacks would have no image (which
    the schema cannot see), and a Sluice service it misses would keep its bundles on host A alone."""
    base = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    hosts = yaml.safe_load((DOCKER / "compose.hosts.yaml").read_text())["services"]
    assert set(hosts) <= set(base)
    from_sluice_image = {name for name, service in base.items() if "build" in service}
    assert from_sluice_image <= set(hosts)
    assert all(hosts[name]["environment"]["SLUICE_STORAGE"].startswith("${SLUICE_STORAGE:?")
               for name in from_sluice_image)
    [published] = hosts["redis"]["ports"]
    assert published.startswith("${SLUICE_REDIS_PUBLISH:?") and published.endswith("}:6379:6379")


# `docker compose config` on the same files: tests/integration/test_compose_docker.py.


def test_the_acl_overlay_gives_every_sluice_service_its_roles_user_and_redis_every_users_password() -> None:
    """docker/compose.acl.yaml: each Sluice service of compose.yaml connects as a user that
    docker/redis-users.acl defines, and Redis puts a password of the env file into every user's line."""
    overlay = yaml.safe_load((DOCKER / "compose.acl.yaml").read_text())
    assert problems(overlay) == []
    base = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    acl_users = {line.split()[1]: line for line in (DOCKER / "redis-users.acl").read_text().splitlines()
                 if line.startswith("user ")}
    assert "off" in acl_users.pop("default").split()
    from_sluice_image = {name for name, service in base.items() if "build" in service or "<<" in service}
    services = overlay["services"]
    assert from_sluice_image - {"prometheus", "grafana"} <= set(services)
    used = set()
    for name, service in services.items():
        if name == "redis":
            continue
        url = service["environment"]["SLUICE_REDIS_URL"]
        user = url.removeprefix("redis://").split(":", 1)[0]
        assert user in acl_users, (name, user)
        used.add(user)
    assert used == set(acl_users)
    command = " ".join(services["redis"]["command"])
    for user, line in acl_users.items():
        placeholder = next(part for part in line.split() if part.startswith(">"))
        assert f"s/{placeholder}/" in command, user
    assert "--aclfile /data/users.acl" in command and "requirepass" not in command
