"""Every Redis key Sluice writes, named in one place.

The stored schema is readable here at a glance, and two modules cannot drift apart on how they
spell the same key. Functions for keys that carry an id, constants for the rest. (Celery's and
kombu's own keys, such as the broker's unacknowledged hash, are theirs and not listed.)
"""

from __future__ import annotations

PREFIX = "sluice"

# -- jobs ----------------------------------------------------------------------------------------
ACTIVE_JOBS = f"{PREFIX}:jobs:active"
"""Set of the ids of jobs not yet ended (enqueuing or running)."""


def job(job_id: str) -> str:
    """Hash of one job: its record (JSON), status, counters and completion bookkeeping."""
    return f"{PREFIX}:job:{job_id}"


def job_done(job_id: str) -> str:
    """Set of the batch indexes of a job whose outcome is recorded."""
    return f"{job(job_id)}:done"


def job_failed(job_id: str) -> str:
    """Hash of a job's failed batches: index -> failure (JSON)."""
    return f"{job(job_id)}:failed"


def job_starts(job_id: str) -> str:
    """Hash of deliveries per batch of a job (and the token of the call that counted each)."""
    return f"{job(job_id)}:starts"


def job_parts(job_id: str) -> str:
    """Hash of the output parts a job's batches wrote: index -> rows."""
    return f"{job(job_id)}:parts"


def job_payloads(job_id: str) -> str:
    """Hash of what each not yet recorded batch carries, to publish a lost one again."""
    return f"{job(job_id)}:payloads"


def job_timed_out(job_id: str) -> str:
    """Hash of a job's batches that ran past the time limit: index -> tries used up so far."""
    return f"{job(job_id)}:timed_out"


def job_keys(job_id: str) -> dict[str, str]:
    """The keys of a job that expire with it once it has ended, by role."""
    return {
        "job": job(job_id), "done": job_done(job_id), "failed": job_failed(job_id),
        "starts": job_starts(job_id), "parts": job_parts(job_id), "payloads": job_payloads(job_id),
    }


def api_jobs(api_name: str) -> str:
    """Sorted set of an API's job ids, scored by submission time."""
    return f"{PREFIX}:api:{api_name}:jobs"


# -- AsyncAPI requests --------------------------------------------------------------------------
def async_request(api_name: str, request_id: str) -> str:
    """Hash of one AsyncAPI request: status, payload (inline) or where it is stored, result's place,
    message, times; expires `SLUICE_ASYNC_RETENTION_S` after its last change (jobs/asyncapi/store.py)."""
    return f"{PREFIX}:async:{api_name}:{request_id}"


ASYNC_EXPIRY = f"{PREFIX}:async:expiry"
"""Sorted set of AsyncAPI requests ("<api>/<id>") scored by when they expire: beat removes their
stored payload and result then (beat/steps.py)."""


def async_counts(api_name: str) -> str:
    """Hash of an AsyncAPI's requests now `in_queue` and `in_progress`, changed by the same scripts
    that change the requests' records (jobs/asyncapi/store.py)."""
    return f"{PREFIX}:async-counts:{api_name}"


def async_ended(api_name: str, slot: int) -> str:
    """Hash of an AsyncAPI's requests ended in one slot of `ASYNC_SLOT_S` seconds: status -> count
    (`sluice get`'s per-minute figures); expires a few minutes after its slot."""
    return f"{PREFIX}:async-ended:{api_name}:{slot}"


def async_queued(api_name: str) -> str:
    """List of the ids of an AsyncAPI's requests submitted while it has `server_side_batching`, oldest
    at the right: a node running one of them claims others from here into the same `predict` call."""
    return f"{PREFIX}:async-queued:{api_name}"


def async_wake(api_name: str) -> str:
    """Set (with a short expiry) while a task that runs an AsyncAPI's queued requests is on its way:
    a submission that finds it set sends none, so a burst is one task per batch, not per request."""
    return f"{PREFIX}:async-wake:{api_name}"


def async_unstarted(api_name: str) -> str:
    """Sorted set of an AsyncAPI's requests stored with a task message of their own (or not yet
    offered to batches) that no delivery has taken, scored in the order they were stored: beat sends
    again those whose message left the API's queue without a node taking them (beat/lost_requests.py)."""
    return f"{PREFIX}:async-unstarted:{api_name}"


def async_claims(api_name: str, owner: str) -> str:
    """Set of the requests of an API claimed into the batch of one delivery (`owner`: its task id):
    that delivery, if its node dies and its message comes back, takes them again."""
    return f"{PREFIX}:async-claims:{api_name}:{owner}"


# -- nodes ---------------------------------------------------------------------------------------
NODES = f"{PREFIX}:nodes"
"""Hash of worker nodes' heartbeats: node name -> {queues, seen} (JSON)."""

ASYNC_NODES = f"{PREFIX}:async-nodes"
"""Hash of the nodes placed on each AsyncAPI: API name -> JSON list of node names (jobs/placement/asyncapi.py)."""

INFLIGHT_PATTERN = f"{PREFIX}:inflight:*"


def inflight(node: str) -> str:
    """Hash of a node's in-flight deliveries: task id -> "<job id>:<batch index>"."""
    return f"{PREFIX}:inflight:{node}"


def node_of_inflight(key: str) -> str:
    """The node an in-flight hash (a key matching INFLIGHT_PATTERN) belongs to."""
    return key[len(INFLIGHT_PATTERN) - 1:]


# -- APIs, replicas and proxies ------------------------------------------------------------------
APIS = f"{PREFIX}:apis"
"""Hash of deployed APIs: name -> deployment (JSON)."""

APIS_GENERATION = f"{PREFIX}:apis:generation"
"""Counter raised with every deploy and delete, in the same transaction: each API process keeps the
routes it read for as long as the counter holds still (`api/context.py`)."""

REPLICAS = f"{PREFIX}:replicas"
"""Hash of realtime replicas: replica id -> record (JSON), rewritten every heartbeat."""

PROXIES = f"{PREFIX}:proxies"
"""Hash of proxies: proxy id -> the routes it serves (JSON)."""

HOSTS = f"{PREFIX}:hosts"
"""Hash of the hosts that offer room to replicas or worker nodes: host id -> record (JSON),
rewritten every heartbeat (foundation/hosts.py)."""

WORKER_HOSTS = f"{PREFIX}:worker-hosts"
"""Hash of what each worker host's agent (`sluice workers`) runs: host id -> its queues, minimum and
nodes (JSON), rewritten every heartbeat (jobs/nodes/worker_hosts.py)."""

NODE_PLANS = f"{PREFIX}:node-plans"
"""Hash of what beat wants of each worker host: host id -> {target, busy, at} (JSON), replaced whole
every beat step (jobs/placement/node_plan.py)."""

JOB_WORKER_NOTES = f"{PREFIX}:job-worker-notes"
"""Hash of why an active job runs on fewer nodes than its `workers`: job id -> one line, replaced
whole with NODE_PLANS."""

NODE_SHORTFALL = f"{PREFIX}:node-shortfall"
"""Hash of the worker nodes that fit on no live host: hardware queue -> {count, cpu_m, mem, gpu}
(JSON), replaced whole with NODE_PLANS."""

HOST_DEMAND = f"{PREFIX}:host-demand"
"""String: what beat last measured of the host pools and of what placement could not place (JSON,
jobs/placement/host_demand.py)."""

REPLICA_SCALE = f"{PREFIX}:replica-scale"
"""Hash of each RealtimeAPI's replica count as its scaler last decided: API name -> JSON
(foundation/replica_scale.py)."""

PROXY_LOAD = f"{PREFIX}:proxy-load"
"""Hash of each proxy's running totals of the realtime requests in flight it sampled, per API:
proxy id -> JSON, rewritten once a second (foundation/proxy_load.py)."""

REPLICA_PLACEMENT = f"{PREFIX}:replica-placement"
"""Hash of where each RealtimeAPI's replicas are placed: API name -> JSON {hosts: {host id: count},
desired, pending, reason} (foundation/replica_placement.py, written by jobs/placement/realtime.py)."""


# -- figures (GET /metrics) ----------------------------------------------------------------------
def figure(name: str) -> str:
    """Hash of one figure summed over every process: label values (JSON list) -> count, or for a
    histogram `<labels>|<le>` -> observations in that bucket and `<labels>|sum` (foundation/figures.py)."""
    return f"{PREFIX}:figures:{name}"


# -- log streams (`sluice logs`) -----------------------------------------------------------------
JOB_LOG_PREFIX = f"{PREFIX}:logs:job:"
"""Stream of one job's JSON log lines from every worker: JOB_LOG_PREFIX + job id (foundation/log_streams.py)."""

API_LOG_PREFIX = f"{PREFIX}:logs:api:"
"""Stream of one realtime API's JSON log lines from its replicas: API_LOG_PREFIX + API name."""

ASYNC_LOG_PREFIX = f"{PREFIX}:logs:async:"
"""Stream of one AsyncAPI request's JSON log lines: ASYNC_LOG_PREFIX + "<api name>:<request id>"."""


# -- per-API environments ------------------------------------------------------------------------
def environment_states(env_key: str) -> str:
    """Hash of one API environment's state on each host: host -> {state, seconds, error, at} (JSON)."""
    return f"{PREFIX}:environment:{env_key}"


ENVIRONMENT_FIGURES = f"{PREFIX}:environment-figures"
"""Hash of counters over every host: builds, reused, failed, build_seconds."""


PREDICTOR_BUILD_FAILURES = f"{PREFIX}:predictor-build-failures"
"""Hash of the APIs whose predictor last failed to build on a worker node: name -> {bundle, message, at} (JSON)."""


# -- acknowledgements -----------------------------------------------------------------------------
ACK_FENCE = f"{PREFIX}:ack-fence"
"""Counter every acknowledged answer increments just before its `WAIT` (foundation/acknowledgements.py)."""


def idempotency(scope: str, key: str) -> str:
    """String: the id a submission with this `Idempotency-Key` made, for a day (foundation/idempotency.py)."""
    return f"{PREFIX}:idempotency:{scope}:{key}"


def rollout_slots(api_name: str, deployment: str, kind: str) -> str:
    """Sorted set of the launchers replacing a replica of one API with one deployment, by the kind of
    room they took (`surge` or `unavailable`), scored by when their hold lapses (foundation/rollout_slots.py)."""
    return f"{PREFIX}:rollout:{api_name}:{deployment}:{kind}"
