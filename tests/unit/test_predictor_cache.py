"""One cache of built predictors for batch jobs and AsyncAPIs (`jobs/predictor_cache.py`): built
once per key and version, a new version replaces the old (closed, then its leftovers discarded),
and every build's outcome is told for `sluice get`."""

from __future__ import annotations

import pytest

from foundation.errors import PredictorError
from jobs.predictor_cache import Build, PredictorCache


class Predictor:
    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def close(self) -> None:
        self.events.append(f"close {self.name}")


class Outcomes:
    def __init__(self) -> None:
        self.told: list[tuple[str, ...]] = []

    def failed(self, api_name: str, bundle: str, message: str) -> None:
        self.told.append(("failed", api_name, bundle, message))

    def succeeded(self, api_name: str) -> None:
        self.told.append(("succeeded", api_name))


def build(name: str, events: list[str], bundle: str = "b1") -> Build[Predictor]:
    def make() -> Predictor:
        events.append(f"build {name}")
        return Predictor(name, events)

    return Build("iris", bundle, make, lambda: events.append(f"discard {name}"))


def test_a_predictor_is_built_once_per_version_and_a_new_version_replaces_it_in_order() -> None:
    events: list[str] = []
    cache: PredictorCache[Predictor] = PredictorCache(Outcomes())

    first = cache.get("iris", "v1", build("v1", events))
    assert cache.get("iris", "v1", build("v1-again", events)) is first
    second = cache.get("iris", "v2", build("v2", events))

    assert second is not first and cache.held_keys() == ["iris"]
    assert events == ["build v1", "close v1", "discard v1", "build v2"]
    cache.forget("iris")
    cache.forget("never-built")
    assert events[-2:] == ["close v2", "discard v2"] and cache.held_keys() == []


def test_each_build_is_told_and_a_failed_one_holds_nothing() -> None:
    outcomes = Outcomes()
    cache: PredictorCache[Predictor] = PredictorCache(outcomes)

    def broken() -> Predictor:
        raise PredictorError("predictor.py line 3: NameError: name 'np' is not defined")

    with pytest.raises(PredictorError):
        cache.get("iris", "v1", Build("iris", "b1", broken, lambda: None))
    cache.get("iris", "v1", build("v1", []))

    assert outcomes.told == [("failed", "iris", "b1", "predictor.py line 3: NameError: name 'np' is not defined"),
                             ("succeeded", "iris")]
    assert cache.held("iris")
