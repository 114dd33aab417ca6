"""`AsyncRequestStore` in memory, for fast tests of the AsyncAPI runner (the Redis one: `jobs/asyncapi/store.py`)."""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Sequence

from foundation.api_registry import not_deployed
from jobs.asyncapi.counts import AsyncCounts, slot_of, window_slots
from jobs.asyncapi.request import AsyncRequest, RequestStatus
from jobs.asyncapi.store import UNSTARTED_LIMIT, Outcome, RouteChanged, Submitted, Taken
from jobs.placement.asyncapi import Placed
from jobs.transport.delivery import Delivery, request_entry
from jobs.transport.task_messages import QueuedMessage


class MemoryAsyncRequests:
    """Records in a dict; the same contract as `RedisAsyncRequests` (expiry by the `now` given)."""

    def __init__(self, retention_s: float = 3600.0, registered: Callable[[str], bool] = lambda api_name: True,
                 inflight: dict[str, dict[str, str]] | None = None,
                 generation: Callable[[], int] = lambda: 0) -> None:
        """`registered(api_name)`: whether the API is deployed (`submit` refuses one that is not);
        `generation()`: the registry's generation (`submit` refuses a route read at another);
        `inflight`: the nodes' in-flight hashes `begin` and `finish` enter and leave deliveries in,
        shared with a `MemoryNodes` as Redis's keys are (`MemoryNodes(ttl, inflight=store.inflight)`)."""
        self.retention_s = retention_s
        self.inflight: dict[str, dict[str, str]] = inflight if inflight is not None else {}
        self.pushed: dict[str, list[bytes]] = {}  # the broker's lists `submit` pushed task messages on, newest first
        self._registered = registered
        self._generation = generation
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], AsyncRequest] = {}
        self._expires: dict[tuple[str, str], float] = {}
        self._counts: dict[tuple[str, RequestStatus], int] = {}  # (api, in_queue | in_progress) -> now
        self._ended: dict[tuple[str, int, RequestStatus], int] = {}  # (api, slot, outcome) -> count
        self._owners: dict[tuple[str, str], str] = {}
        self._queued: dict[str, deque[str]] = {}
        self._claims: dict[tuple[str, str], set[str]] = {}
        self._woken: set[str] = set()  # APIs a task for whose queued requests is on its way (no expiry here)
        self._unstarted: dict[str, dict[str, None]] = {}  # api -> its unstarted request ids, in the order stored

    def _move(self, api_name: str, before: RequestStatus | None, after: RequestStatus | None) -> None:
        for status, step in ((before, -1), (after, 1)):
            if status is not None and not status.is_terminal:
                self._counts[(api_name, status)] = self._counts.get((api_name, status), 0) + step

    def create(self, request: AsyncRequest, now: float) -> bool:
        key = (request.api_name, request.request_id)
        with self._lock:
            if key in self._records:
                return False
            self._records[key] = request
            self._expires[key] = now + self.retention_s
            self._move(request.api_name, None, RequestStatus.IN_QUEUE)
            self._unstarted.setdefault(request.api_name, {})[request.request_id] = None
            return True

    def _started(self, api_name: str, request_id: str) -> None:
        self._unstarted.get(api_name, {}).pop(request_id, None)

    def submit(self, request: AsyncRequest, now: float, *, queued: bool = False,
               message: QueuedMessage | None = None, generation: int | None = None) -> Submitted:
        if generation is not None and generation != self._generation():
            raise RouteChanged(request.api_name)
        if not self._registered(request.api_name):
            raise not_deployed(request.api_name)
        if not self.create(request, now):
            return Submitted(created=False)
        if message is not None:
            self.send(message)
        return Submitted(created=True, wake=self.queue(request.api_name, request.request_id) if queued else False)

    def send(self, message: QueuedMessage) -> None:
        with self._lock:
            self.pushed.setdefault(message.key, []).insert(0, message.payload)

    def queue(self, api_name: str, request_id: str) -> bool:
        with self._lock:
            self._started(api_name, request_id)
            self._queued.setdefault(api_name, deque()).appendleft(request_id)
            return self._arm(api_name)

    def _arm(self, api_name: str) -> bool:
        if api_name in self._woken:
            return False
        self._woken.add(api_name)
        return True

    def woken(self, api_name: str) -> None:
        with self._lock:
            self._woken.discard(api_name)

    def rearm(self, api_name: str) -> bool:
        with self._lock:
            return bool(self._queued.get(api_name)) and self._arm(api_name)

    def get(self, api_name: str, request_id: str) -> AsyncRequest | None:
        with self._lock:
            return self._records.get((api_name, request_id))

    def get_many(self, api_name: str, request_ids: Sequence[str]) -> dict[str, AsyncRequest]:
        with self._lock:
            found = {request_id: self._records.get((api_name, request_id)) for request_id in request_ids}
        return {request_id: record for request_id, record in found.items() if record is not None}

    def begin(self, api_name: str, request_id: str, now: float, owner: str = "", node: str = "") -> Taken:
        key = (api_name, request_id)
        with self._lock:
            if node and owner:
                self.inflight.setdefault(node, {})[owner] = request_entry(api_name, request_id)
            self._started(api_name, request_id)
            record = self._records.get(key)
            if record is None:
                return Taken(None, 0)
            if record.status.is_terminal:
                return Taken(record.status, 0)
            held_by = self._owners.get(key, "")
            if record.status is RequestStatus.IN_PROGRESS and held_by and held_by != owner:
                return Taken(record.status, 0, held=True)
            deliveries = self._take(key, record, owner)
            return Taken(record.status, deliveries, request=self._records[key])

    def _take(self, key: tuple[str, str], record: AsyncRequest, owner: str) -> int:
        self._records[key] = dataclasses.replace(record, status=RequestStatus.IN_PROGRESS,
                                                 deliveries=record.deliveries + 1)
        self._owners[key] = owner
        self._move(key[0], record.status, RequestStatus.IN_PROGRESS)
        return record.deliveries + 1

    def claim(self, api_name: str, owner: str, limit: int, now: float) -> list[tuple[str, int]]:
        claimed: list[tuple[str, int]] = []
        with self._lock:
            queued = self._queued.get(api_name, deque())
            while queued and len(claimed) < limit:
                request_id = queued.pop()
                key = (api_name, request_id)
                record = self._records.get(key)
                if record is None or record.status is not RequestStatus.IN_QUEUE:
                    continue
                claimed.append((request_id, self._take(key, record, owner)))
                self._started(api_name, request_id)
                self._claims.setdefault((api_name, owner), set()).add(request_id)
        return claimed

    def reclaim(self, api_name: str, owner: str, now: float) -> list[tuple[str, int]]:
        taken: list[tuple[str, int]] = []
        with self._lock:
            for request_id in sorted(self._claims.get((api_name, owner), ())):
                key = (api_name, request_id)
                record = self._records.get(key)
                if record is not None and record.status is RequestStatus.IN_PROGRESS and self._owners.get(key) == owner:
                    taken.append((request_id, self._take(key, record, owner)))
        return taken

    def release(self, api_name: str, owner: str) -> None:
        with self._lock:
            self._claims.pop((api_name, owner), None)

    def finish(self, api_name: str, request_id: str, status: RequestStatus, now: float, *,
               result: bytes | None = None, result_uri: str = "", message: str = "",
               ending: Delivery | None = None) -> bool:
        key = (api_name, request_id)
        with self._lock:
            if ending is not None:
                self.inflight.get(ending.node, {}).pop(ending.task_id, None)
            record = self._records.get(key)
            if record is None or record.status.is_terminal:
                return False
            self._records[key] = dataclasses.replace(record, status=status, timestamp=now,
                                                     result=result, result_uri=result_uri or record.result_uri,
                                                     message=message)
            self._expires[key] = now + self.retention_s
            self._move(api_name, record.status, None)
            self._started(api_name, request_id)
            ended = (api_name, slot_of(now), status)
            self._ended[ended] = self._ended.get(ended, 0) + 1
            return True

    def finish_many(self, api_name: str, outcomes: Sequence[Outcome], now: float) -> list[bool]:
        return [self.finish(api_name, o.request_id, o.status, now, result=o.result, result_uri=o.result_uri,
                            message=o.message) for o in outcomes]

    def expired(self, now: float, limit: int = 500) -> list[tuple[str, str]]:
        with self._lock:
            due = sorted((at, key) for key, at in self._expires.items() if at <= now)
        return [key for _, key in due[:limit]]

    def remove(self, api_name: str, request_id: str) -> None:
        with self._lock:
            record = self._records.pop((api_name, request_id), None)
            self._expires.pop((api_name, request_id), None)
            self._owners.pop((api_name, request_id), None)
            self._started(api_name, request_id)
            if record is not None:
                self._move(api_name, record.status, None)

    def unstarted(self, api_name: str, queue_lists: Sequence[str], limit: int = UNSTARTED_LIMIT) -> list[str]:
        with self._lock:
            waiting = list(self._unstarted.get(api_name, {}))
            messages = sum(len(self.pushed.get(key, [])) for key in queue_lists)
        return waiting[:max(0, min(len(waiting) - messages, limit))]

    def counts(self, api_name: str, now: float) -> AsyncCounts:
        with self._lock:
            slots = window_slots(now)
            return AsyncCounts(
                in_queue=max(0, self._counts.get((api_name, RequestStatus.IN_QUEUE), 0)),
                in_progress=max(0, self._counts.get((api_name, RequestStatus.IN_PROGRESS), 0)),
                completed_per_minute=sum(self._ended.get((api_name, s, RequestStatus.COMPLETED), 0) for s in slots),
                failed_per_minute=sum(self._ended.get((api_name, s, RequestStatus.FAILED), 0) for s in slots),
            )


class MemoryAsyncAssignments:
    """`AsyncAssignments` (`jobs/placement/asyncapi.py`) in a dict, for fast tests of AsyncAPI placement."""

    def __init__(self) -> None:
        self._placed: dict[str, Placed] = {}

    def all(self) -> dict[str, list[str]]:
        return {api: list(placed.nodes) for api, placed in self._placed.items()}

    def placed(self) -> dict[str, Placed]:
        return dict(self._placed)

    def set(self, api_name: str, nodes: list[str], desired: int | None = None, in_flight: float = 0.0) -> None:
        self._placed[api_name] = Placed(list(nodes), len(nodes) if desired is None else desired, in_flight)

    def forget(self, api_name: str) -> None:
        self._placed.pop(api_name, None)
