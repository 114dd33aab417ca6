"""Which APIs' predictors fail to build on worker nodes, so that `sluice get` can say so for any kind.

A realtime replica that cannot build its predictor says so in its own record; a worker node
builds a job's (or AsyncAPI's, or TaskAPI's) predictor on the job's first batch, and a failure
there ends that job, not the API. So each node's build of an API's predictor also leaves its
outcome here: a failure with its reason, cleared again by the next build of that API that
succeeds. Redis being away never fails a build: this is what is shown, not what is done.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Protocol

import redis

from foundation import keys

log = logging.getLogger(__name__)


class PredictorBuilds(Protocol):
    """The last failed build of each API's predictor on a worker node."""

    def failed(self, api_name: str, bundle: str, message: str) -> None:
        """A build failed: keep why (the latest failure wins)."""

    def succeeded(self, api_name: str) -> None:
        """A build succeeded: the API's failure, if any, is over."""

    def failure(self, api_name: str) -> dict[str, Any] | None:
        """{bundle, message, at} of the API's last failed build, None when none is kept."""

    def forget(self, api_name: str) -> None:
        """The API was deployed again or deleted."""


class RedisPredictorBuilds(PredictorBuilds):
    """The last failed predictor build of each API, in one Redis hash."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    def failed(self, api_name: str, bundle: str, message: str) -> None:
        try:
            self._redis.hset(keys.PREDICTOR_BUILD_FAILURES, api_name,
                             json.dumps({"bundle": bundle, "message": message, "at": time.time()}))
        except redis.RedisError as e:
            log.warning("could not record the failed build of api %s: %s", api_name, e)

    def succeeded(self, api_name: str) -> None:
        try:
            self._redis.hdel(keys.PREDICTOR_BUILD_FAILURES, api_name)
        except redis.RedisError as e:
            log.warning("could not record the build of api %s: %s", api_name, e)

    def failure(self, api_name: str) -> dict[str, Any] | None:
        """The API's last failed build ({bundle, message, at}), None when its last build succeeded."""
        raw = self._redis.hget(keys.PREDICTOR_BUILD_FAILURES, api_name)
        if raw is None:
            return None
        try:
            found = json.loads(raw)
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    def forget(self, api_name: str) -> None:
        """The API was deleted (or redeployed): its old failure is not its new version's."""
        self.succeeded(api_name)
