"""A worker process's built predictors, by key: the one cache behind a batch job's predictor
(`jobs/batch/predictors.py`, keyed by job) and an AsyncAPI's (`jobs/asyncapi/runner.py`, keyed by
API and replaced by a new deployment).

Building is the expensive part (unpacking a bundle, loading models, starting an environment's
process), so a predictor is built once per key and version and kept. Its owner builds it (inside
`build_outcome`, which tells `BuildOutcomes` how it went, so `sluice get` shows an API in error),
and closes then discards what its build left (models, the bundle's hold) when it takes it back.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from foundation.errors import PredictorError


class Closable(Protocol):
    def close(self) -> None: ...


P = TypeVar("P", bound=Closable)
K = TypeVar("K")


class BuildOutcomes(Protocol):
    """Told how each build of an API's predictor ended (`foundation.predictor_builds.RedisPredictorBuilds`)."""

    def failed(self, api_name: str, bundle: str, message: str) -> None: ...

    def succeeded(self, api_name: str) -> None: ...


@contextmanager
def build_outcome(outcomes: BuildOutcomes | None, api_name: str, bundle: str) -> Iterator[None]:
    """Around a build: its failure (a `PredictorError`) or success told to `outcomes` for `sluice
    get`. (A context, not a function taking the build, so that nothing here calls back into the
    caller's module: tests/integration/test_batch_path.py holds the batch path to that.)"""
    try:
        yield
    except PredictorError as e:
        if outcomes is not None:
            outcomes.failed(api_name, bundle, e.message)
        raise
    if outcomes is not None:
        outcomes.succeeded(api_name)


@dataclass(frozen=True)
class _Held(Generic[P, K]):
    version: Hashable
    predictor: P
    token: K  # what the owner needs to discard it (the job, the deployment)


class PredictorCache(Generic[P, K]):
    """Predictors by key, each held at one version. Thread-safe: a node's main thread builds, a
    watchdog thread may forget. The owner builds, closes and discards: the cache only holds."""

    def __init__(self) -> None:
        self._held: dict[str, _Held[P, K]] = {}
        self._lock = threading.Lock()

    def current(self, key: str, version: Hashable) -> P | None:
        """The predictor held for `key` at `version`; None when none is, or another version is
        (which `take` then hands over, for its owner to close and discard)."""
        with self._lock:
            held = self._held.get(key)
        return held.predictor if held is not None and held.version == version else None

    def put(self, key: str, version: Hashable, predictor: P, token: K) -> None:
        with self._lock:
            self._held[key] = _Held(version, predictor, token)

    def take(self, key: str) -> tuple[P, K] | None:
        """The predictor held for `key` and its token, no longer held; None when there is none."""
        with self._lock:
            held = self._held.pop(key, None)
        return (held.predictor, held.token) if held is not None else None

    def held_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._held)
