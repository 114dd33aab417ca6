"""`AsyncRequestStore` in memory, for fast tests of the AsyncAPI runner (the Redis one: `jobs/async_store.py`)."""

from __future__ import annotations

import dataclasses
import threading

from .async_request import AsyncRequest, RequestStatus
from .async_store import Taken


class MemoryAsyncRequests:
    """Records in a dict; the same contract as `RedisAsyncRequests` (expiry by the `now` given)."""

    def __init__(self, retention_s: float = 3600.0) -> None:
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], AsyncRequest] = {}
        self._expires: dict[tuple[str, str], float] = {}

    def create(self, request: AsyncRequest, now: float) -> bool:
        key = (request.api_name, request.request_id)
        with self._lock:
            if key in self._records:
                return False
            self._records[key] = request
            self._expires[key] = now + self.retention_s
            return True

    def get(self, api_name: str, request_id: str) -> AsyncRequest | None:
        with self._lock:
            return self._records.get((api_name, request_id))

    def begin(self, api_name: str, request_id: str, now: float) -> Taken:
        key = (api_name, request_id)
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return Taken(None, 0)
            if record.status.is_terminal:
                return Taken(record.status, 0)
            self._records[key] = dataclasses.replace(record, status=RequestStatus.IN_PROGRESS,
                                                     deliveries=record.deliveries + 1)
            return Taken(record.status, record.deliveries + 1)

    def finish(self, api_name: str, request_id: str, status: RequestStatus, now: float, *,
               result_uri: str = "", message: str = "") -> bool:
        key = (api_name, request_id)
        with self._lock:
            record = self._records.get(key)
            if record is None or record.status.is_terminal:
                return False
            self._records[key] = dataclasses.replace(record, status=status, timestamp=now,
                                                     result_uri=result_uri or record.result_uri, message=message)
            self._expires[key] = now + self.retention_s
            return True

    def expired(self, now: float, limit: int = 500) -> list[tuple[str, str]]:
        with self._lock:
            due = sorted((at, key) for key, at in self._expires.items() if at <= now)
        return [key for _, key in due[:limit]]

    def remove(self, api_name: str, request_id: str) -> None:
        with self._lock:
            self._records.pop((api_name, request_id), None)
            self._expires.pop((api_name, request_id), None)
