"""What a worker node does with one AsyncAPI request (the `sluice.run_async` task).

1. The delivery enters the node's in-flight hash, so that if the node dies its message is given
   back at once and another node (or the node's next life) runs the request (`jobs/transport/settle.py`):
   in the same step as 2. (one round trip), and it leaves it in the step that records the request's
   outcome when that is its last (one request, no batch), else after everything else.
2. The request is taken (`AsyncRequestStore.begin`) under the delivery's task id: one that has
   ended (a duplicate delivery, a request whose time limit ended the last node), or that another
   delivery holds in its batch, is only acknowledged. One whose nodes died running it more than
   `LOST_REQUEST_ALLOWANCE` times is failed (a predictor holding the GIL past its time limit).
3. With `server_side_batching`, the delivery also takes what it claimed before its node died
   (`reclaim`) and claims up to `max_batch_size` queued requests of the API, waiting at most
   `batch_interval` for them (`claim`): one `predict` call of lists, each request recorded with
   its own element, or its own failure.
4. The API's predictor in this process, built once per API version (`AsyncPredictors`).
5. `predict` runs under `predictor.request_timeout`: past it the requests are failed and the
   node's process ends, as for a hung batch (`jobs/batch/time_limit.py`); its supervisor starts it again.
   A predictor holding the GIL starves that watchdog: the kernel's hard stop ends the process
   `SLUICE_HARD_STOP_GRACE_S` later, and the requests' next delivery counts it as lost (2.).
6. A small result goes in the request's record, a large one to storage first; the request is
   recorded `completed` exactly once. A request whose `predict` raises (or returns what JSON cannot
   hold) is `failed`, never retried.

Log lines: what the predictor logs while it is built and runs a batch goes to every request's log
stream of the batch (`capture`), since one `predict` call's lines cannot be told apart per request;
what is said of one request (its failure, a new delivery) goes to that request's stream alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from foundation.api_kinds import ApiKind
from foundation.api_registry import ApiRegistry, DeployedApi
from foundation.errors import ApiNotFound, PredictorError, SluiceError
from foundation.json_logs import labelled
from foundation.limits import ASYNC_INLINE_RESULT_BYTES
from foundation.settings import Settings
from jobs.asyncapi.objects import RequestObjects
from jobs.asyncapi.request import AsyncRequest, RequestStatus, decode_payload, one_line
from jobs.asyncapi.store import AsyncRequestStore, Outcome
from jobs.batch.time_limit import hard_stop, hook_time_limit, timed_out_message
from jobs.nodes.registry import NodeRegistry
from jobs.predictor_cache import BuildOutcomes, PredictorCache, build_outcome
from jobs.transport.delivery import Delivery, request_entry
from predictors_runtime.async_predictor import AsyncPredictor
from predictors_runtime.bundles import BundleStore
from predictors_runtime.config import ApiConfig
from predictors_runtime.environments import HostEnvironments
from predictors_runtime.environments.remote import start_in_environment

log = logging.getLogger(__name__)

# Deliveries of a request whose node died running it, beyond the first, before it is failed instead
# of run again: a node killed by chance gives it to another, a predictor that ends every node
# running it (holding the GIL past `request_timeout` until the kernel's hard stop) does not loop.
LOST_REQUEST_ALLOWANCE = 1
# How often a delivery gathering a batch looks for more queued requests within `batch_interval`.
CLAIM_POLL_S = 0.01
# How old a node's view of an API's deployment may be when it runs a request: one registry read a
# second per API and process, not one per request; a redeploy (or delete) reaches requests within it.
DEPLOYMENT_TTL_S = 1.0
# The in-flight entry's request id of a task for an API's queued requests (no request id is this: ids are hex or
# the client's, and a client's may not hold '/'; the entry only needs to say it is an AsyncAPI's).
QUEUED_ENTRY = "queued-requests"
# Requests a task for queued requests takes when the API was redeployed without batching (each runs alone),
# or fails when the API is gone; what is left is the next task's.
UNBATCHED_PER_TASK = 8
ORPHANS_PER_TASK = 100


# Where the lines logged around some requests of an API also go: (api name, request ids) -> a block.
Capture = Callable[[str, Sequence[str]], AbstractContextManager[None]]


def _no_capture(api_name: str, request_ids: Sequence[str]) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


class RequestPredictor(Protocol):
    """What the runner asks of an AsyncAPI's predictor (`predictors_runtime.async_predictor.AsyncPredictor`)."""

    def predict(self, payload: Any, request_id: str | list[str]) -> Any:
        """The user's `predict` / `handle_async` on one request, or on lists of them (batching)."""

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

    def __init__(self, bundles: BundleStore, settings: Settings, environments: HostEnvironments | None = None) -> None:
        self._bundles = bundles
        self._cache_dir = Path(settings.cache_dir).expanduser()
        self._poll_interval_s = settings.model_poll_interval_s
        self._environments = environments or HostEnvironments.under(settings.cache_dir)

    def _models(self, deployed: DeployedApi) -> Path:
        return self._cache_dir / "models" / f"async-{deployed.name}-{deployed.bundle[:16]}"

    def build(self, deployed: DeployedApi) -> RequestPredictor:
        folder = self._bundles.local_folder(deployed.bundle)
        log.info("building predictor of async api %s (bundle %s)", deployed.name, deployed.bundle[:12])
        if deployed.environment:  # in a process of the API's own environment (jobs/batch/predictors.py says why)
            recipe = {"kind": "async", "model_cache_dir": str(self._models(deployed)),
                      "poll_interval_s": self._poll_interval_s}
            return start_in_environment(self._environments, deployed.environment, folder,
                                        ApiConfig.from_dict(deployed.spec), recipe)
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

    def __init__(self, builder: AsyncBuilder, outcomes: BuildOutcomes | None = None) -> None:
        self._builder = builder
        self._outcomes = outcomes
        self._built: PredictorCache[RequestPredictor, DeployedApi] = PredictorCache()

    def predictor_for(self, deployed: DeployedApi) -> RequestPredictor:
        predictor = self._built.current(deployed.name, version_of(deployed))
        if predictor is not None:
            return predictor
        self.forget(deployed.name)  # an older version's models and modules go first
        with build_outcome(self._outcomes, deployed.name, deployed.bundle):
            predictor = self._builder.build(deployed)
        self._built.put(deployed.name, version_of(deployed), predictor, deployed)
        return predictor

    def forget(self, api_name: str) -> None:
        taken = self._built.take(api_name)
        if taken is not None:
            predictor, deployed = taken
            predictor.close()
            self._builder.discard(deployed)

    def built(self) -> list[str]:
        """The APIs whose predictor this process holds."""
        return self._built.held_keys()


@dataclass
class Member:
    """One request of the delivery's batch (a batch of one without `server_side_batching`)."""

    request: AsyncRequest
    deliveries: int
    payload: Any = None


class AsyncRuntime:
    """Runs AsyncAPI requests in one worker process."""

    def __init__(
        self, requests: AsyncRequestStore, objects: RequestObjects, registry: ApiRegistry, nodes: NodeRegistry,
        predictors: AsyncPredictors, *, end_process: Callable[[int], Any] = os._exit,
        clock: Callable[[], float] = time.time, sleep: Callable[[float], Any] = time.sleep,
        hard_stop_grace_s: float | None = None, wake: Callable[[str], Any] = lambda api_name: None,
        deployment_ttl_s: float = DEPLOYMENT_TTL_S, capture: Capture = _no_capture,
    ) -> None:
        """`clock` and `sleep` (gathering a batch) and `end_process` (the time limit) are given by
        fast tests; `hard_stop_grace_s`: seconds past `request_timeout` the kernel ends the process
        (None: never); `wake(api_name)` sends a task for an API's queued requests; `deployment_ttl_s`: how
        old its view of an API's deployment may be (0: read for every request); `capture(api_name, ids)`:
        where the lines logged around those requests also go (their log streams)."""
        self.requests = requests
        self.objects = objects
        self.registry = registry
        self.nodes = nodes
        self.predictors = predictors
        self._end_process = end_process
        self._clock = clock
        self._sleep = sleep
        self._hard_stop_grace_s = hard_stop_grace_s
        self._wake = wake
        self._deployment_ttl_s = deployment_ttl_s
        self._capture = capture
        self._deployments: dict[str, tuple[float, DeployedApi]] = {}
        self._configs: dict[tuple[str, str, float], ApiConfig] = {}

    def run_request(self, api_name: str, request_id: str, delivery: Delivery | None = None) -> None:
        """Run one delivery of a request (and its batch) and record each outcome once (see the module's steps)."""
        with labelled(api_name=api_name, request_id=request_id):
            ended = self._run(api_name, request_id, delivery)
        if delivery is not None and not ended:  # left in place by a process that died: settling gives it back
            self.nodes.end_delivery(delivery)

    def _deployed(self, api_name: str) -> DeployedApi:
        """The API as deployed, read from the registry at most once a `deployment_ttl_s` (`ApiNotFound`
        is never kept): a redeploy reaches this process's requests within that."""
        now = self._clock()
        kept = self._deployments.get(api_name)
        if kept is not None and 0 <= now - kept[0] < self._deployment_ttl_s:
            return kept[1]
        deployed = self.registry.get(api_name)
        self._deployments[api_name] = (now, deployed)
        return deployed

    def _config(self, deployed: DeployedApi) -> ApiConfig:
        """The deployment's config, validated once per version (not once per request)."""
        version = (deployed.name, *version_of(deployed))
        config = self._configs.get(version)
        if config is None:
            self._configs = {v: c for v, c in self._configs.items() if v[0] != deployed.name}
            config = self._configs[version] = ApiConfig.from_dict(deployed.spec)
        return config

    def run_queued(self, api_name: str, delivery: Delivery | None = None) -> None:
        """Run one delivery of the task a submission sent for an API's queued requests (with
        `server_side_batching`, a burst sends one such task per batch rather than one per request):
        up to `max_batch_size` of them claimed into one `predict`, then another task sent if some
        are still queued (`wake`)."""
        if delivery is not None:
            self.nodes.begin_delivery(delivery, request_entry(api_name, QUEUED_ENTRY))
        owner = delivery.task_id if delivery is not None else ""
        with labelled(api_name=api_name):
            still_deployed = self._run_queued(api_name, owner)
        if delivery is not None:
            self.nodes.end_delivery(delivery)
        if still_deployed and self.requests.rearm(api_name):
            self._wake(api_name)

    def _run_queued(self, api_name: str, owner: str) -> bool:
        """The batch; whether the API is still deployed (else no next task: beat's placement retires it)."""
        self.requests.woken(api_name)  # a request queued from now on sends the next task
        taking = self.requests.reclaim(api_name, owner, self._clock()) if owner else []
        try:
            deployed = self._deployed(api_name)
        except ApiNotFound:
            deployed = None
        if deployed is None or deployed.kind != ApiKind.ASYNC:
            why = (f"api {api_name} is not deployed any more" if deployed is None
                   else f"api {api_name} is now a {deployed.kind}, not an {ApiKind.ASYNC}")
            for request_id, _ in taking + self.requests.claim(api_name, owner, ORPHANS_PER_TASK, self._clock()):
                self._fail(api_name, request_id, why)
            self.requests.release(api_name, owner)
            return deployed is not None
        config = self._config(deployed)
        batching = config.predictor.server_side_batching
        limit = config.predictor.request_timeout
        members = self._members(api_name, taking, limit, {})
        if batching is None:  # redeployed without batching: a few of them, each run alone
            gathered = self._gather(api_name, owner, UNBATCHED_PER_TASK, 0.0, len(members))
        else:
            gathered = self._gather(api_name, owner, batching.max_batch_size, batching.batch_interval, len(members))
        members += self._members(api_name, gathered, limit, {})
        if batching is None:
            for member in members:
                self._predict(deployed, [member], limit, batched=False)
        elif members:
            self._predict(deployed, members, limit, batched=True)
        self.requests.release(api_name, owner)
        return True

    def _fail(self, api_name: str, request_id: str, message: str, ending: Delivery | None = None) -> None:
        message = one_line(message)
        if self.requests.finish(api_name, request_id, RequestStatus.FAILED, self._clock(), message=message,
                                ending=ending):
            with self._capture(api_name, [request_id]):
                log.warning("async request %s of api %s failed: %s", request_id, api_name, message)

    def _run(self, api_name: str, request_id: str, delivery: Delivery | None) -> bool:
        """The delivery's steps; whether it has left its node's in-flight hash already (with the outcome
        of its one request, recorded last)."""
        owner = delivery.task_id if delivery is not None else ""
        taken = self.requests.begin(api_name, request_id, self._clock(), owner,
                                    delivery.node if delivery is not None else "")
        if taken.held:
            log.info("async request %s of api %s is in another delivery's batch; nothing to run", request_id, api_name)
            return False
        if not taken.runs and not owner:
            log.info("async request %s of api %s is %s; nothing to run", request_id, api_name,
                     taken.status.value if taken.status else "unknown (expired)")
            return False
        try:
            deployed = self._deployed(api_name)
        except ApiNotFound:
            if taken.runs:
                self._fail(api_name, request_id, f"api {api_name} is not deployed any more")
            return False
        if deployed.kind != ApiKind.ASYNC:
            if taken.runs:
                self._fail(api_name, request_id, f"api {api_name} is now a {deployed.kind}, not an {ApiKind.ASYNC}")
            return False
        config = self._config(deployed)
        batching = config.predictor.server_side_batching
        taking = [(request_id, taken.deliveries)] if taken.runs else []
        # What this delivery claimed before its node died (also after a redeploy without batching).
        reclaiming = bool(owner) and (batching is not None or taken.deliveries != 1)
        if reclaiming:
            taking += self.requests.reclaim(api_name, owner, self._clock())
        if not taking:
            log.info("async request %s of api %s is %s; nothing to run", request_id, api_name,
                     taken.status.value if taken.status else "unknown (expired)")
            return False
        limit = config.predictor.request_timeout
        known = {request_id: taken.request} if taken.runs and taken.request is not None else {}
        members = self._members(api_name, taking, limit, known)
        if batching is None and not reclaiming and len(members) == 1:  # the common case: its outcome is the last step
            self._predict(deployed, members, limit, batched=False, ending=delivery)
            return delivery is not None
        if batching is None:
            for member in members:
                self._predict(deployed, [member], limit, batched=False)
        else:
            if owner and members:
                gathered = self._gather(api_name, owner, batching.max_batch_size, batching.batch_interval, len(members))
                members += self._members(api_name, gathered, limit, {})
            if members:
                self._predict(deployed, members, limit, batched=True)
        if reclaiming:
            self.requests.release(api_name, owner)
        return False

    def _gather(self, api_name: str, owner: str, max_size: int, interval: float, have: int) -> list[tuple[str, int]]:
        """Queued requests claimed into this delivery's batch: up to `max_size` in all, waiting
        at most `interval` seconds for them."""
        deadline = self._clock() + interval
        claimed: list[tuple[str, int]] = []
        while True:
            claimed += self.requests.claim(api_name, owner, max_size - have - len(claimed), self._clock())
            left = deadline - self._clock()
            if have + len(claimed) >= max_size or left <= 0:
                return claimed
            self._sleep(min(CLAIM_POLL_S, left))

    def _members(self, api_name: str, taking: list[tuple[str, int]], limit: float | None,
                 known: dict[str, AsyncRequest]) -> list[Member]:
        """The requests taken, with their payloads (records not `known` yet read in one round trip);
        those that cannot run are failed here, each alone."""
        missing = [request_id for request_id, _ in taking if request_id not in known]
        records = {**known, **(self.requests.get_many(api_name, missing) if missing else {})}
        members = []
        for request_id, deliveries in taking:
            lost = deliveries - 1
            if lost > LOST_REQUEST_ALLOWANCE:
                self._fail(api_name, request_id, lost_message(lost, limit))
                continue
            if lost > 0:
                with self._capture(api_name, [request_id]):
                    log.warning("async request %s of api %s is delivered again (delivery %d): a node died running it",
                                request_id, api_name, deliveries)
            request = records.get(request_id)
            if request is None:  # expired between the two reads
                continue
            try:
                payload = self._payload(request)
            except (SluiceError, ValueError) as e:  # storage lost it, or it no longer reads as its kind
                self._fail(api_name, request_id, f"reading the request's payload failed: {e}")
                continue
            members.append(Member(request, deliveries, payload))
        return members

    def _payload(self, request: AsyncRequest) -> Any:
        body = request.payload if request.payload is not None else self.objects.read(request.payload_uri)
        return decode_payload(request.kind, body)

    def _fail_all(self, members: list[Member], message: str, ending: Delivery | None = None) -> None:
        """Each member failed; `ending` (a delivery of one member) leaves its node's in-flight hash with it."""
        for member in members:
            self._fail(member.request.api_name, member.request.request_id, message, ending)

    def _predict(self, deployed: DeployedApi, members: list[Member], limit: float | None, *, batched: bool,
                 ending: Delivery | None = None) -> None:
        """Build (or reuse) the predictor and run it on the members, each recorded once; what is logged
        meanwhile is every member's. `ending`: the delivery of the one member, whose last step is
        recording its outcome (it leaves its node's in-flight hash in the same step), unless its time
        limit ends the process (then it stays, for settling to give back)."""
        with self._capture(deployed.name, [m.request.request_id for m in members]):
            self._predict_captured(deployed, members, limit, batched=batched, ending=ending)

    def _predict_captured(self, deployed: DeployedApi, members: list[Member], limit: float | None, *,
                          batched: bool, ending: Delivery | None) -> None:
        api_name = deployed.name
        try:
            predictor = self.predictors.predictor_for(deployed)
        except PredictorError as e:
            self._fail_all(members, f"building the predictor failed: {e.message}", ending)
            return
        ids = [m.request.request_id for m in members]

        def timed_out() -> None:
            log.error("async request(s) %s of api %s %s; ending this node's process to stop it",
                      ids, api_name, timed_out_message(limit))
            self._fail_all(members, timed_out_message(limit))

        try:
            with hook_time_limit(limit, timed_out, self._end_process), hard_stop(limit, self._hard_stop_grace_s):
                if batched:
                    result = predictor.predict([m.payload for m in members], ids)
                else:
                    result = predictor.predict(members[0].payload, ids[0])
        except Exception as e:  # noqa: BLE001 - the user's code may raise anything: the requests fail, once
            self._fail_all(members, f"{type(e).__name__}: {e}", ending)
            return
        if not batched:
            self._record(members[0], result, ending)
            return
        if not isinstance(result, list) or len(result) != len(members):
            got = f"a list of {len(result)}" if isinstance(result, list) else f"a {type(result).__name__}"
            self._fail_all(members, f"with server_side_batching, predict must return a list of one result per "
                                    f"request; it returned {got} for {len(members)} request(s)")
            return
        # The batch's outcomes in one round trip: recording them one by one was most of a batch's time.
        outcomes = [self._outcome(member, one) for member, one in zip(members, result, strict=True)]
        for outcome, recorded in zip(outcomes, self.requests.finish_many(api_name, outcomes, self._clock()),
                                     strict=True):
            self._recorded(api_name, outcome, recorded)

    def _record(self, member: Member, result: Any, ending: Delivery | None = None) -> None:
        """The member's outcome; `ending`: its delivery, leaving its node's in-flight hash in the same step."""
        outcome = self._outcome(member, result)
        recorded = self.requests.finish(member.request.api_name, outcome.request_id, outcome.status, self._clock(),
                                        result=outcome.result, result_uri=outcome.result_uri,
                                        message=outcome.message, ending=ending)
        self._recorded(member.request.api_name, outcome, recorded)

    def _outcome(self, member: Member, result: Any) -> Outcome:
        """What `predict` returned for the member, as its outcome: completed with its result (inline when
        small, else stored first), or failed when JSON cannot hold it."""
        request_id = member.request.request_id
        try:
            encoded = json.dumps(result).encode()
        except (TypeError, ValueError) as e:
            return Outcome(request_id, RequestStatus.FAILED, message=one_line(
                f"predict returned a {type(result).__name__}, which is not JSON-serialisable ({e})"))
        if len(encoded) <= ASYNC_INLINE_RESULT_BYTES:
            return Outcome(request_id, RequestStatus.COMPLETED, result=encoded)
        uri = self.objects.put_result(member.request.api_name, request_id, encoded, member.deliveries)
        return Outcome(request_id, RequestStatus.COMPLETED, result_uri=uri)

    def _recorded(self, api_name: str, outcome: Outcome, recorded: bool) -> None:
        """Say what became of an outcome, in its request's log stream."""
        request_id = outcome.request_id
        if outcome.status is RequestStatus.FAILED:
            if recorded:
                with self._capture(api_name, [request_id]):
                    log.warning("async request %s of api %s failed: %s", request_id, api_name, outcome.message)
        elif not recorded:
            with self._capture(api_name, [request_id]):
                log.info("async request %s of api %s had ended already; this result is not recorded", request_id,
                         api_name)


def lost_message(lost: int, limit: float | None) -> str:
    """A request failed because the nodes running it kept dying."""
    why = (f"it ran past its request_timeout ({limit:g} s) holding the GIL, or its node died each time"
           if limit is not None else "its node died each time (killed, or out of memory)")
    return f"the process running it ended {lost} times: {why}"
