"""The registry of deployed APIs, in Redis so every API server and worker host sees the same."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from foundation import keys
from foundation.errors import ApiNotFound

_KEY = keys.APIS


@dataclass(frozen=True)
class DeployedApi:
    """One deployment of one API: its validated config (as a dict: `ApiConfig.from_dict(spec)`
    reads it back) and the bundle holding its code."""

    name: str
    kind: str
    spec: dict[str, Any]
    bundle: str
    queue: str
    deployed_at: float
    ignored_fields: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """What `GET /apis` shows."""
        return {
            "name": self.name,
            "kind": self.kind,
            "bundle": self.bundle,
            "queue": self.queue,
            "deployed_at": self.deployed_at,
            "ignored_fields": self.ignored_fields,
            "spec": self.spec,
        }


class ApiRegistry:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def put(self, api: ApiConfig, bundle: str, now: float | None = None) -> DeployedApi:
        """Register (or replace) an API. Running jobs keep the bundle they started with."""
        deployed = DeployedApi(
            name=api.name,
            kind=api.kind,
            spec=api.to_dict(),
            bundle=bundle,
            queue=api.queue,
            deployed_at=time.time() if now is None else now,
            ignored_fields=list(api.ignored_fields),
        )
        self._redis.hset(_KEY, api.name, json.dumps(deployed.to_dict()))
        return deployed

    def get(self, name: str) -> DeployedApi:
        raw = self._redis.hget(_KEY, name)
        if raw is None:
            raise ApiNotFound(f"api {name} is not deployed")
        return DeployedApi(**json.loads(raw))

    def all(self) -> list[DeployedApi]:
        return sorted(
            (DeployedApi(**json.loads(raw)) for raw in self._redis.hvals(_KEY)), key=lambda a: a.name
        )

    def delete(self, name: str) -> None:
        if not self._redis.hdel(_KEY, name):
            raise ApiNotFound(f"api {name} is not deployed")
