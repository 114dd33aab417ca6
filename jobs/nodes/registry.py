"""Worker nodes: their heartbeats and the deliveries each holds in flight.

A node announces itself with a heartbeat (which hardware queues it serves, when it was last seen),
written by a thread of the node (`jobs/nodes/worker_node.py`). While it runs a batch or a job's
completion, the task id of that delivery sits in the node's in-flight hash, so that if the node
dies its unacknowledged message can be given back at the head of its queue at once instead of
after Redis's visibility timeout (`jobs/transport/settle.py`): a reconnecting node settles what it held, and
beat gives back what a node silent for `GIVE_BACK_AFTER_TTLS` node TTLs held (`jobs/placement/batch.py`).

A batch enters and leaves its node's in-flight hash inside the batch ledger's own scripts
(`jobs/store/ledger.py`), atomically with its outcome, and an AsyncAPI request's delivery inside the
request store's (`jobs/asyncapi/store.py` `begin` and `finish`); everything else about nodes is here.
`NodeRegistry` is what callers ask; `Nodes` keeps it in Redis, `MemoryNodes` (`jobs/nodes/memory.py`)
in memory, and both pass the same contract tests.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import redis

from foundation import keys
from foundation.redis_clients import text

# The delivery values are exported here too: what a node holds is spoken of in them.
from jobs.transport.delivery import (
    COMPLETION_ENTRY,
    Delivery,
    inflight_entry,
    is_request_entry,
    job_of_entry,
    parse_inflight_entry,
)

__all__ = [
    "COMPLETION_ENTRY",
    "GIVE_BACK_AFTER_TTLS",
    "Delivery",
    "NodeRegistry",
    "Nodes",
    "inflight_entry",
    "is_placed_queue",
    "is_request_entry",
    "job_of_entry",
    "live_and_dead",
    "parse_inflight_entry",
    "silent_too_long",
]

log = logging.getLogger(__name__)

# Silent this many node TTLs, a node's deliveries are given back (longer than "lost" for
# placement: a predictor holding the GIL misses heartbeats while alive).
GIVE_BACK_AFTER_TTLS = 4
# Silent this many node TTLs, a node is dropped from the registry.
FORGET_AFTER_TTLS = 20

Heartbeats = dict[str, dict[str, Any]]
"""Node name -> {"queues": the hardware queues it serves, "seen": when it last beat}."""



def is_placed_queue(name: str) -> bool:
    """A job's queue (`job.<id>`) or an AsyncAPI's (`async.<api>`, `jobs/placement/asyncapi.py`): placed
    work a node consumes, not a hardware queue it serves."""
    return name.startswith(("job.", "async."))


def heartbeat_record(queues: list[str], now: float) -> dict[str, Any]:
    """What a heartbeat holds: the node's hardware queues (job queues left out) and the time."""
    return {"queues": sorted(q for q in queues if not is_placed_queue(q)), "seen": now}


def live_and_dead(heartbeats: Heartbeats, now: float, node_ttl_s: float) -> tuple[dict[str, list[str]], list[str]]:
    """(live node -> hardware queues, nodes silent for so long they are to be dropped from the registry)."""
    live: dict[str, list[str]] = {}
    dead: list[str] = []
    for name, record in heartbeats.items():
        age = now - float(record["seen"])
        if age <= node_ttl_s:
            live[name] = record["queues"]
        elif age > FORGET_AFTER_TTLS * node_ttl_s:
            dead.append(name)
    return live, dead


def silent_too_long(node: str, now: float, heartbeats: Heartbeats, node_ttl_s: float) -> bool:
    """Whether `node`'s deliveries are to be given back: gone from the registry, or silent for
    GIVE_BACK_AFTER_TTLS node TTLs."""
    record = heartbeats.get(node)
    return record is None or now - float(record["seen"]) > GIVE_BACK_AFTER_TTLS * node_ttl_s


class NodeRegistry(Protocol):
    """The registry of worker nodes and their in-flight deliveries."""

    node_ttl_s: float

    def heartbeat(self, node: str, queues: list[str], now: float) -> None:
        """Record that `node` is alive and which hardware queues it serves (job queues are left out)."""

    def forget(self, node: str) -> None:
        """`node` is gone (it stopped): it is no longer live."""

    def heartbeats(self) -> Heartbeats:
        """Every node's last heartbeat; an unreadable one is logged and left out, not fatal to the rest."""

    def live(self, now: float, heartbeats: Heartbeats | None = None) -> dict[str, list[str]]:
        """Live node name -> hardware queues it consumes. Long-dead nodes are dropped from the registry."""

    def begin_delivery(self, delivery: Delivery, entry: str) -> None:
        """Enter a task other than a batch (a job's completion) in its node's in-flight hash."""

    def end_delivery(self, delivery: Delivery) -> None:
        """Take a delivery that will not be recorded (its job ended) off its node's in-flight hash."""

    def inflight(self, node: str) -> dict[str, str]:
        """A node's in-flight deliveries: task id -> "<job id>:<batch index>"."""

    def inflight_nodes(self) -> list[str]:
        """Nodes with an in-flight hash (live ones, and dead ones whose batches were not given back yet)."""

    def forget_inflight(self, node: str, task_ids: Iterable[str]) -> None:
        """Take these deliveries off the node's in-flight hash."""


def jobs_held(nodes: NodeRegistry, names: Sequence[str]) -> dict[str, set[str]]:
    """Node -> ids of the jobs it holds deliveries of."""
    return {
        name: {job_of_entry(entry) for entry in nodes.inflight(name).values() if not is_request_entry(entry)}
        for name in names
    }


class Nodes:
    """`NodeRegistry` in Redis (`foundation.keys.NODES` and the nodes' in-flight hashes); the client
    is passed in, never found globally."""

    def __init__(self, client: redis.Redis, node_ttl_s: float) -> None:
        self._redis = client
        self.node_ttl_s = node_ttl_s

    def heartbeat(self, node: str, queues: list[str], now: float) -> None:
        self._redis.hset(keys.NODES, node, json.dumps(heartbeat_record(queues, now)))

    def forget(self, node: str) -> None:
        self._redis.hdel(keys.NODES, node)

    def heartbeats(self) -> Heartbeats:
        heartbeats = {}
        for raw_name, raw in self._redis.hgetall(keys.NODES).items():
            name = text(raw_name)
            try:
                record = json.loads(raw)
                heartbeats[name] = {"queues": [str(q) for q in record["queues"]], "seen": float(record["seen"])}
            except (ValueError, TypeError, KeyError) as e:
                log.warning("ignoring the unreadable heartbeat of node %s: %r", name, e)
        return heartbeats

    def live(self, now: float, heartbeats: Heartbeats | None = None) -> dict[str, list[str]]:
        live, dead = live_and_dead(self.heartbeats() if heartbeats is None else heartbeats, now, self.node_ttl_s)
        if dead:
            self._redis.hdel(keys.NODES, *dead)
        return live

    def begin_delivery(self, delivery: Delivery, entry: str) -> None:
        self._redis.hset(keys.inflight(delivery.node), delivery.task_id, entry)

    def end_delivery(self, delivery: Delivery) -> None:
        self._redis.hdel(keys.inflight(delivery.node), delivery.task_id)

    def inflight(self, node: str) -> dict[str, str]:
        return {text(k): text(v) for k, v in self._redis.hgetall(keys.inflight(node)).items()}

    def inflight_nodes(self) -> list[str]:
        return sorted(
            keys.node_of_inflight(text(raw)) for raw in self._redis.scan_iter(match=keys.INFLIGHT_PATTERN, count=500)
        )

    def forget_inflight(self, node: str, task_ids: Iterable[str]) -> None:
        task_ids = list(task_ids)
        if task_ids:
            self._redis.hdel(keys.inflight(node), *task_ids)
