"""What a worker node does with one AsyncAPI request (the `sluice.run_async` task).

1. The delivery enters the node's in-flight hash, so that if the node dies its message is given
   back at once and another node (or the node's next life) runs the request (`jobs/settle.py`).
2. The request is taken (`AsyncRequestStore.begin`): one that has ended (a duplicate delivery,
   a request whose time limit ended the last node) is only acknowledged.
3. The API's predictor in this process, built once per API version (`AsyncPredictors`).
4. `predict` runs under `predictor.request_timeout`: past it the request is failed and the node's
   process ends, as for a hung batch (`jobs/time_limit.py`); its supervisor starts it again.
5. The result goes to storage, then the request is recorded `completed`, exactly once; a request
   whose `predict` raises (or returns what JSON cannot hold) is `failed`, never retried.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.errors import ApiNotFound, PredictorError, SluiceError
from foundation.json_logs import labelled
from foundation.settings import Settings
from predictors_runtime.async_predictor import AsyncPredictor
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig

from .async_objects import RequestObjects
from .async_request import ASYNC_KIND, AsyncRequest, RequestStatus, decode_payload, one_line
from .async_store import AsyncRequestStore
from .delivery import Delivery, request_entry
from .nodes import NodeRegistry
from .time_limit import hook_time_limit, timed_out_message

log = logging.getLogger(__name__)


class RequestPredictor(Protocol):
    """What the runner asks of an AsyncAPI's predictor (`predictors_runtime.async_predictor.AsyncPredictor`)."""

    def predict(self, payload: Any, request_id: str) -> Any:
        """The user's `predict` / `handle_async` on one request."""

    def close(self) -> None:
        """Drop the predictor and its models."""


class AsyncBuilder(Protocol):
    """Builds an AsyncAPI's predictor for one deployment of it."""

    def build(self, deployed: DeployedApi) -> RequestPredictor:
        """`PredictorError` when it cannot be built."""

    def discard(self, deployed: DeployedApi) -> None:
        """What building it left on this host may go."""


class BundleAsyncBuilder:
    """`AsyncBuilder` from the deployment's bundle, models cached under `<cache_dir>/models/async-<api>`."""

    def __init__(self, bundles: BundleStore, settings: Settings) -> None:
        self._bundles = bundles
        self._cache_dir = Path(settings.cache_dir).expanduser()
        self._poll_interval_s = settings.model_poll_interval_s

    def _models(self, deployed: DeployedApi) -> Path:
        return self._cache_dir / "models" / f"async-{deployed.name}-{deployed.bundle[:16]}"

    def build(self, deployed: DeployedApi) -> RequestPredictor:
        folder = self._bundles.local_folder(deployed.bundle)
        log.info("building predictor of async api %s (bundle %s)", deployed.name, deployed.bundle[:12])
        return AsyncPredictor.build(folder, ApiConfig.from_dict(deployed.spec), model_cache_dir=self._models(deployed),
                                    poll_interval_s=self._poll_interval_s)

    def discard(self, deployed: DeployedApi) -> None:
        import shutil

        shutil.rmtree(self._models(deployed), ignore_errors=True)
        self._bundles.release(deployed.bundle)


def version_of(deployed: DeployedApi) -> tuple[str, float]:
    """What makes a deployment a new version: its bundle and when it was deployed (a new config)."""
    return deployed.bundle, deployed.deployed_at


class AsyncPredictors:
    """Per process: each AsyncAPI's predictor, built on its first request and kept until a new version."""

    def __init__(self, builder: AsyncBuilder) -> None:
        self._builder = builder
        self._built: dict[str, tuple[DeployedApi, RequestPredictor]] = {}

    def predictor_for(self, deployed: DeployedApi) -> RequestPredictor:
        held = self._built.get(deployed.name)
        if held is not None and version_of(held[0]) == version_of(deployed):
            return held[1]
        if held is not None:  # a new version: the old one's models and modules go first
            self.forget(deployed.name)
        predictor = self._builder.build(deployed)
        self._built[deployed.name] = (deployed, predictor)
        return predictor

    def forget(self, api_name: str) -> None:
        held = self._built.pop(api_name, None)
        if held is not None:
            held[1].close()
            self._builder.discard(held[0])

    def built(self) -> list[str]:
        """The APIs whose predictor this process holds."""
        return sorted(self._built)


class AsyncRuntime:
    """Runs AsyncAPI requests in one worker process."""

    def __init__(
        self, requests: AsyncRequestStore, objects: RequestObjects, registry: ApiRegistry, nodes: NodeRegistry,
        predictors: AsyncPredictors, *, end_process: Callable[[int], Any] = os._exit,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.requests = requests
        self.objects = objects
        self.registry = registry
        self.nodes = nodes
        self.predictors = predictors
        self._end_process = end_process
        self._clock = clock

    def run_request(self, api_name: str, request_id: str, delivery: Delivery | None = None) -> None:
        """Run one delivery of a request and record its outcome once (see the module's steps)."""
        if delivery is not None:
            self.nodes.begin_delivery(delivery, request_entry(api_name, request_id))
        with labelled(api_name=api_name, request_id=request_id):
            self._run(api_name, request_id)
        if delivery is not None:  # left in place by a process that died: settling gives it back
            self.nodes.end_delivery(delivery)

    def _fail(self, api_name: str, request_id: str, message: str) -> None:
        message = one_line(message)
        if self.requests.finish(api_name, request_id, RequestStatus.FAILED, self._clock(), message=message):
            log.warning("async request %s of api %s failed: %s", request_id, api_name, message)

    def _run(self, api_name: str, request_id: str) -> None:
        taken = self.requests.begin(api_name, request_id, self._clock())
        if not taken.runs:
            log.info("async request %s of api %s is %s; nothing to run", request_id, api_name,
                     taken.status.value if taken.status else "unknown (expired)")
            return
        if taken.deliveries > 1:
            log.warning("async request %s of api %s is delivered again (delivery %d): a node died running it",
                        request_id, api_name, taken.deliveries)
        request = self.requests.get(api_name, request_id)
        if request is None:  # expired between the two reads
            return
        try:
            deployed = self.registry.get(api_name)
        except ApiNotFound:
            self._fail(api_name, request_id, f"api {api_name} is not deployed any more")
            return
        if deployed.kind != ASYNC_KIND:
            self._fail(api_name, request_id, f"api {api_name} is now a {deployed.kind}, not an {ASYNC_KIND}")
            return
        try:
            payload = self._payload(request)
        except (SluiceError, ValueError) as e:  # storage lost it, or it no longer reads as its kind
            self._fail(api_name, request_id, f"reading the request's payload failed: {e}")
            return
        try:
            predictor = self.predictors.predictor_for(deployed)
        except PredictorError as e:
            self._fail(api_name, request_id, f"building the predictor failed: {e.message}")
            return
        limit = ApiConfig.from_dict(deployed.spec).predictor.request_timeout
        self._predict(request, predictor, payload, limit, taken.deliveries)

    def _payload(self, request: AsyncRequest) -> Any:
        body = request.payload if request.payload is not None else self.objects.read(request.payload_uri)
        return decode_payload(request.kind, body)

    def _predict(self, request: AsyncRequest, predictor: RequestPredictor, payload: Any, limit: float | None,
                 delivery: int) -> None:
        api_name, request_id = request.api_name, request.request_id

        def timed_out() -> None:
            log.error("async request %s of api %s %s; ending this node's process to stop it",
                      request_id, api_name, timed_out_message(limit))
            self._fail(api_name, request_id, timed_out_message(limit))

        try:
            with hook_time_limit(limit, timed_out, self._end_process):
                result = predictor.predict(payload, request_id)
        except Exception as e:  # noqa: BLE001 - the user's code may raise anything: the request fails, once
            self._fail(api_name, request_id, f"{type(e).__name__}: {e}")
            return
        try:
            encoded = json.dumps(result).encode()
        except (TypeError, ValueError) as e:
            self._fail(api_name, request_id,
                       f"predict returned a {type(result).__name__}, which is not JSON-serialisable ({e})")
            return
        uri = self.objects.put_result(api_name, request_id, encoded, delivery)
        if not self.requests.finish(api_name, request_id, RequestStatus.COMPLETED, self._clock(), result_uri=uri):
            log.info("async request %s of api %s had ended already; this result is not recorded", request_id, api_name)
