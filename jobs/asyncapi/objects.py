"""Where AsyncAPI payloads and results live in storage: beside the bundles (`SLUICE_STORAGE`).

A request's large payload and its result are objects under `<storage>/async/<api>/<id>/`, so
nothing large sits in Redis; beat removes them when the request's retention ends.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import suppress

from foundation.errors import SluiceError, StorageNotFound
from predictors_runtime.storage import join_uri, storage_for

PAYLOAD = "payload"

log = logging.getLogger(__name__)


class RequestObjects:
    """The stored payloads and results of AsyncAPI requests under one storage root."""

    def __init__(self, root: str) -> None:
        self._root = root

    def uri(self, api_name: str, request_id: str, name: str) -> str:
        return join_uri(self._root, "async", api_name, request_id, name)

    def put_payload(self, api_name: str, request_id: str, body: bytes) -> str:
        """Each submission writes its own object, before its request is stored: a second submission of the
        same id never replaces the payload the request was stored with."""
        uri = self.uri(api_name, request_id, f"{PAYLOAD}-{uuid.uuid4().hex}")
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

    @staticmethod
    def discard(uri: str) -> None:
        """Delete one object no request refers to; one that cannot be deleted now goes with its request's
        folder when that request's retention ends."""
        try:
            storage_for(uri).delete(uri)
        except SluiceError as e:
            log.warning("could not delete %s (it goes when its request's retention ends): %s", uri, e)

    def remove(self, api_name: str, request_id: str) -> None:
        """Delete what a request left in storage (nothing happens for what is not there)."""
        folder = join_uri(self._root, "async", api_name, request_id) + "/"
        storage = storage_for(folder)
        with suppress(StorageNotFound):
            for info in list(storage.list(folder)):
                storage.delete(info.uri)
