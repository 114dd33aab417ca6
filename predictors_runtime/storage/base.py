"""The storage contract every backend keeps, and the registry that picks one by URI scheme."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable
from urllib.parse import urlparse

from predictors_runtime.errors import ConfigError


class Storage(ABC):
    """A flat key space of bytes under one root; keys are POSIX-style relative paths."""

    @abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; raises `NotFound` naming the key when it is absent."""

    @abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Store `data` under `key`, replacing it atomically for readers."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""

    @abstractmethod
    def describe(self, key: str) -> str:
        """The full URI of `key`, for messages."""


_BACKENDS: dict[str, Callable[[str], Storage]] = {}


def register_backend(scheme: str, factory: Callable[[str], Storage]) -> None:
    _BACKENDS[scheme] = factory


def open_storage(uri: str) -> Storage:
    """The storage for a root URI: a local folder (no scheme or `file://`) or a registered scheme."""
    scheme = urlparse(uri).scheme
    if scheme in ("", "file") or len(scheme) == 1:  # one letter: a Windows drive, treat as a path
        from .local import LocalStorage

        return LocalStorage(uri[len("file://"):] if scheme == "file" else uri)
    factory = _BACKENDS.get(scheme)
    if factory is None:
        raise ConfigError(f"storage {uri!r}: unsupported scheme {scheme!r}")
    return factory(uri)
