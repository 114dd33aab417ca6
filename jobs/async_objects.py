"""Where AsyncAPI payloads and results live in storage: beside the bundles (`SLUICE_STORAGE`).

A request's large payload and its result are objects under `<storage>/async/<api>/<id>/`, so
nothing large sits in Redis; beat removes them when the request's retention ends.
"""

from __future__ import annotations

from contextlib import suppress

from foundation.errors import StorageNotFound
from predictors_runtime.storage import join_uri, storage_for

PAYLOAD = "payload"


class RequestObjects:
    """The stored payloads and results of AsyncAPI requests under one storage root."""

    def __init__(self, root: str) -> None:
        self._root = root

    def uri(self, api_name: str, request_id: str, name: str) -> str:
        return join_uri(self._root, "async", api_name, request_id, name)

    def put_payload(self, api_name: str, request_id: str, body: bytes) -> str:
        uri = self.uri(api_name, request_id, PAYLOAD)
        storage_for(uri).write_bytes(uri, body)
        return uri

    def put_result(self, api_name: str, request_id: str, encoded: bytes, delivery: int) -> str:
        """Each delivery writes its own object: a late duplicate never replaces the result recorded."""
        uri = self.uri(api_name, request_id, f"result-{delivery}.json")
        storage_for(uri).write_bytes(uri, encoded)
        return uri

    @staticmethod
    def read(uri: str) -> bytes:
        return storage_for(uri).read_bytes(uri)

    def remove(self, api_name: str, request_id: str) -> None:
        """Delete what a request left in storage (nothing happens for what is not there)."""
        folder = join_uri(self._root, "async", api_name, request_id) + "/"
        storage = storage_for(folder)
        with suppress(StorageNotFound):
            for info in list(storage.list(folder)):
                storage.delete(info.uri)
