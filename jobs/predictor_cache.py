"""A worker process's built predictors, by key: the one cache behind a batch job's predictor
(`jobs/batch/predictors.py`, keyed by job) and an AsyncAPI's (`jobs/asyncapi/runner.py`, keyed by
API and replaced by a new deployment).

Building is the expensive part (unpacking a bundle, loading models, starting an environment's
process), so a predictor is built once per key and version and kept. Replacing or forgetting one
closes it, then discards what its build left on the host (models, the bundle's hold), in that
order. Each build's outcome is told to `BuildOutcomes`, so `sluice get` shows an API in error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from foundation.errors import PredictorError

T = TypeVar("T")


class Closable(Protocol):
    def close(self) -> None: ...


P = TypeVar("P", bound=Closable)


class BuildOutcomes(Protocol):
    """Told how each build of an API's predictor ended (`foundation.predictor_builds.RedisPredictorBuilds`)."""

    def failed(self, api_name: str, bundle: str, message: str) -> None: ...

    def succeeded(self, api_name: str) -> None: ...


def record_build(outcomes: BuildOutcomes | None, api_name: str, bundle: str, build: Callable[[], T]) -> T:
    """`build()`, its failure (a `PredictorError`) or success told to `outcomes` for `sluice get`."""
    try:
        built = build()
    except PredictorError as e:
        if outcomes is not None:
            outcomes.failed(api_name, bundle, e.message)
        raise
    if outcomes is not None:
        outcomes.succeeded(api_name)
    return built


@dataclass(frozen=True)
class Build(Generic[P]):
    """How to build one predictor, and what to clean up after it: `discard()` once it is closed."""

    api_name: str
    bundle: str
    make: Callable[[], P]
    discard: Callable[[], None]


@dataclass(frozen=True)
class _Held(Generic[P]):
    version: Hashable
    predictor: P
    discard: Callable[[], None]


class PredictorCache(Generic[P]):
    """Predictors by key, each built once per version. Thread-safe: a node's main thread builds, a
    watchdog thread may forget."""

    def __init__(self, outcomes: BuildOutcomes | None = None) -> None:
        self._outcomes = outcomes
        self._held: dict[str, _Held[P]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, version: Hashable, build: Build[P]) -> P:
        """The predictor held for `key` at `version`; another version's is closed and replaced."""
        with self._lock:
            held = self._held.get(key)
        if held is not None and held.version == version:
            return held.predictor
        if held is not None:  # a new version: the old one's models and modules go first
            self.forget(key)
        predictor = record_build(self._outcomes, build.api_name, build.bundle, build.make)
        with self._lock:
            self._held[key] = _Held(version, predictor, build.discard)
        return predictor

    def held(self, key: str) -> bool:
        with self._lock:
            return key in self._held

    def forget(self, key: str) -> None:
        """Close the predictor held for `key` (if any) and discard what its build left."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            held.predictor.close()
            held.discard()

    def held_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._held)
