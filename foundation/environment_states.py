"""Where hosts say how an API's environment fares on each of them, and the counts `/metrics` shows.

A host that builds an environment (a worker node's first batch of a job, a replica launcher's new
generation) writes `building`, then `ready` with the seconds it took or `failed` with the
installer's message, under the environment's key and its own host name; `GET /apis/<name>` and
`sluice get` read them back. A host that finds the environment already built counts a reuse.
Redis being away never fails a build: the state is information, the build is the work.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

import redis

from foundation import keys

from .redis_clients import text

log = logging.getLogger(__name__)

STATE_TTL_S = 30 * 24 * 3600


class RedisEnvironmentStates:
    """`predictors_runtime.environments.host.BuildEvents` kept in Redis, for one host."""

    def __init__(self, client: redis.Redis, host: str | None = None) -> None:
        self._redis = client
        self.host = host or socket.gethostname()

    def _write(self, env_key: str, state: dict[str, Any], figures: dict[str, float]) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            if state:
                pipe.hset(keys.environment_states(env_key), self.host, json.dumps({**state, "at": time.time()}))
                pipe.expire(keys.environment_states(env_key), STATE_TTL_S)
            for name, amount in figures.items():
                pipe.hincrbyfloat(keys.ENVIRONMENT_FIGURES, name, amount)
            pipe.execute()
        except redis.RedisError as e:
            log.warning("could not record the state of environment %s: %s", env_key, e)

    def building(self, key: str) -> None:
        self._write(key, {"state": "building"}, {})

    def built(self, key: str, seconds: float) -> None:
        self._write(key, {"state": "ready", "seconds": round(seconds, 3)}, {"builds": 1, "build_seconds": seconds})

    def reused(self, key: str) -> None:
        self._write(key, {}, {"reused": 1})

    def failed(self, key: str, message: str) -> None:
        self._write(key, {"state": "failed", "error": message}, {"failed": 1})

    def states(self, key: str) -> dict[str, dict[str, Any]]:
        """Host -> its state of the environment `key` (an unreadable one left out)."""
        found = {}
        for raw_host, raw in self._redis.hgetall(keys.environment_states(key)).items():
            host = text(raw_host)
            try:
                found[host] = json.loads(raw)
            except ValueError:
                continue
        return found

    def figures(self) -> dict[str, float]:
        """Counts over every host: builds, reused, failed, build_seconds."""
        raw = self._redis.hgetall(keys.ENVIRONMENT_FIGURES)
        out = {}
        for name, value in raw.items():
            try:
                out[text(name)] = float(value)
            except ValueError:
                continue
        return out
