"""The registry of deployed APIs, shared by every API server, worker host, proxy and replica launcher.

`ApiRegistry` is what callers type against; `RedisApiRegistry` keeps the deployments in one Redis
hash (`keys.APIS`: name -> `DeployedApi.to_dict()` as JSON) so every host sees the same, and
`foundation.memory.MemoryApiRegistry` keeps them in a dict for fast tests. Both pass the same
contract tests (`tests/contracts/api_registry.py`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import redis

from foundation import keys
from foundation.errors import ApiNotFound, did_you_mean
from foundation.redis_clients import text

_KEY = keys.APIS


class ApiDefinition(Protocol):
    """What the registry reads of a validated API config (`predictors_runtime.config.ApiConfig`)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def ignored_fields(self) -> Sequence[str]: ...

    def to_dict(self) -> dict[str, Any]: ...


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
    # The environment locked at deploy (`predictors_runtime.environments.EnvironmentSpec.to_dict()`),
    # None when the project installs nothing: its nodes and replicas run in Sluice's own.
    environment: dict[str, Any] | None = None

    @classmethod
    def of(cls, api: ApiDefinition, bundle: str, now: float | None = None,
           environment: dict[str, Any] | None = None) -> DeployedApi:
        """The deployment of `api` with `bundle` (and its locked `environment`), at `now` (default: now)."""
        return cls(
            name=api.name,
            kind=api.kind,
            spec=api.to_dict(),
            bundle=bundle,
            queue=api.queue,
            deployed_at=time.time() if now is None else now,
            ignored_fields=list(api.ignored_fields),
            environment=environment,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        """The stored form."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: str | bytes) -> DeployedApi:
        return cls(**json.loads(raw))

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


class ApiRegistry(Protocol):
    """The deployed APIs. A registry that cannot be reached raises `redis.RedisError` (a
    `redis.ConnectionError` when it cannot be reached at all)."""

    def put(self, api: ApiDefinition, bundle: str, now: float | None = None,
            environment: dict[str, Any] | None = None) -> DeployedApi:
        """Register (or replace) an API. Running jobs keep the bundle (and environment) they started with."""
        ...

    def get(self, name: str) -> DeployedApi:
        """The API's deployment; `ApiNotFound` when none is registered."""
        ...

    def all(self) -> list[DeployedApi]:
        """Every deployment, by name."""
        ...

    def delete(self, name: str) -> None:
        """Forget the API; `ApiNotFound` when none is registered."""
        ...

    def generation(self) -> int:
        """A number that changes with every `put` and `delete`, wherever they ran: what a process read
        at one generation is still what the registry holds while the number holds still."""
        ...


def not_deployed(name: str, deployed: Iterable[str] = ()) -> ApiNotFound:
    """The error for `name`, suggesting the deployed API spelled closest to it."""
    return ApiNotFound(f"api {name} is not deployed{did_you_mean(name, deployed)}")


class RedisApiRegistry(ApiRegistry):
    """`ApiRegistry` in one Redis hash; the client is passed in."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def put(self, api: ApiDefinition, bundle: str, now: float | None = None,
            environment: dict[str, Any] | None = None) -> DeployedApi:
        deployed = DeployedApi.of(api, bundle, now, environment)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(_KEY, api.name, deployed.to_json())
        pipe.incr(keys.APIS_GENERATION)
        pipe.execute()
        return deployed

    def get(self, name: str) -> DeployedApi:
        raw = self._redis.hget(_KEY, name)
        if raw is None:
            raise not_deployed(name, (text(key) for key in self._redis.hkeys(_KEY)))
        return DeployedApi.from_json(raw)

    def all(self) -> list[DeployedApi]:
        raws = self._redis.hvals(_KEY)
        return sorted((DeployedApi.from_json(raw) for raw in raws), key=lambda a: a.name)

    def delete(self, name: str) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.hdel(_KEY, name)
        pipe.incr(keys.APIS_GENERATION)
        deleted, _ = pipe.execute()
        if not deleted:
            raise not_deployed(name)

    def generation(self) -> int:
        return int(self._redis.get(keys.APIS_GENERATION) or 0)
