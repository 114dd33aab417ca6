"""One cache of built predictors for batch jobs and AsyncAPIs (`jobs/predictor_cache.py`): it
holds one predictor per key at one version and hands it back to its owner to close; every build's
outcome is told for `sluice get`. (Its owners' use: tests/unit/test_predictors.py and
test_async_runner.py.)"""

from __future__ import annotations

import pytest

from foundation.errors import PredictorError
from jobs.predictor_cache import PredictorCache, build_outcome


class Predictor:
    def close(self) -> None:
        pass


class Outcomes:
    def __init__(self) -> None:
        self.told: list[tuple[str, ...]] = []

    def failed(self, api_name: str, bundle: str, message: str) -> None:
        self.told.append(("failed", api_name, bundle, message))

    def succeeded(self, api_name: str) -> None:
        self.told.append(("succeeded", api_name))


def test_a_predictor_is_current_only_at_the_version_it_was_held_at_and_taken_back_with_its_token() -> None:
    cache: PredictorCache[Predictor, str] = PredictorCache()
    first = Predictor()

    assert cache.current("iris", "v1") is None
    cache.put("iris", "v1", first, "the deployment of v1")
    assert cache.current("iris", "v1") is first
    assert cache.current("iris", "v2") is None  # another version: its owner takes the old one back
    assert cache.held_keys() == ["iris"]

    assert cache.take("iris") == (first, "the deployment of v1")
    assert cache.take("iris") is None and cache.held_keys() == []


def test_each_build_is_told_and_a_failed_one_raises_on() -> None:
    outcomes = Outcomes()

    with pytest.raises(PredictorError), build_outcome(outcomes, "iris", "b1"):
        raise PredictorError("predictor.py line 3: NameError: name 'np' is not defined")
    with build_outcome(outcomes, "iris", "b2"):
        pass
    with build_outcome(None, "iris", "b3"):  # a process that reports nowhere
        pass

    assert outcomes.told == [("failed", "iris", "b1", "predictor.py line 3: NameError: name 'np' is not defined"),
                             ("succeeded", "iris")]
