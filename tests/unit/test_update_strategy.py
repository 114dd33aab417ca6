"""A RealtimeAPI's `update_strategy`, as a cortex.yaml writes it: counts or percentages of the wanted
replicas, resolved as a Deployment's are, and refused where they cannot mean anything."""

from __future__ import annotations

import pytest

from foundation.errors import ConfigError
from foundation.rollout_slots import HOLD_S, SURGE, UNAVAILABLE, MemoryRolloutSlots
from predictors_runtime.config import ApiConfig, parse_deployment
from predictors_runtime.update_strategy import UpdateStrategy


def _api(kind: str = "RealtimeAPI", **fields: object) -> ApiConfig:
    return ApiConfig.from_dict({"name": "a", "kind": kind, "predictor": {"path": "p.py"}, **fields})


@pytest.mark.parametrize(("surge", "unavailable", "replicas", "bounds"), [
    ("25%", "25%", 1, (1, 0)),     # Cortex's defaults on one replica: a surge of one, none missing
    ("25%", "25%", 4, (1, 1)),
    ("25%", "25%", 10, (3, 2)),    # a surge rounds up, an unavailability down
    (1, 0, 3, (1, 0)),
    (0, "50%", 3, (0, 1)),
    ("0%", "10%", 3, (0, 1)),      # both resolving to zero: one may be missing, so the redeploy moves
    ("100%", 0, 3, (3, 0)),
])
def test_counts_and_percentages_resolve_against_the_wanted_replicas(surge, unavailable, replicas, bounds):
    assert UpdateStrategy(max_surge=surge, max_unavailable=unavailable).bounds(replicas) == bounds


def test_a_realtime_api_without_one_follows_cortexs_defaults_and_one_written_is_kept():
    assert _api().rollout == UpdateStrategy(max_surge="25%", max_unavailable="25%")
    written = _api(update_strategy={"max_surge": "1", "max_unavailable": "0%"})
    assert written.rollout == UpdateStrategy(max_surge=1, max_unavailable="0%")
    assert written.to_dict()["update_strategy"] == {"max_surge": 1, "max_unavailable": "0%"}
    assert ApiConfig.from_dict(written.to_dict()) == written  # stored and read back the same


@pytest.mark.parametrize(("strategy", "message"), [
    ({"max_surge": 0, "max_unavailable": 0}, "cannot both be 0"),
    ({"max_surge": "150%"}, "a percentage from 0% to 100%"),
    ({"max_surge": -1}, "must not be negative"),
    ({"max_unavailable": "a few"}, "a count of replicas or a percentage"),
    ({"max_surge": 1, "maxSurge": 1}, "maxSurge"),
])
def test_a_strategy_that_cannot_run_is_refused_naming_the_field(strategy, message):
    with pytest.raises(ConfigError, match=message):
        _api(update_strategy=strategy)


def test_outside_a_realtime_api_it_is_accepted_as_cortex_wrote_it_and_reported_ignored():
    [api] = _deployed_with_update_strategy("BatchAPI")
    assert api.update_strategy is None and "update_strategy" in api.ignored_fields
    [realtime] = _deployed_with_update_strategy("RealtimeAPI")
    assert realtime.update_strategy == UpdateStrategy(max_surge=1, max_unavailable=0)
    assert "update_strategy" not in realtime.ignored_fields


def _deployed_with_update_strategy(kind: str) -> list[ApiConfig]:
    text = (f"- name: a\n  kind: {kind}\n  predictor: {{type: python, path: p.py}}\n"
            "  update_strategy: {max_surge: 1, max_unavailable: 0}\n")
    return list(parse_deployment(text).apis)


def test_rollout_slots_hold_at_most_the_limit_each_renewable_and_lapsing_after_their_hold():
    slots = MemoryRolloutSlots()
    assert slots.take("a", "v2", SURGE, "one", 1, now=0.0)
    assert not slots.take("a", "v2", SURGE, "two", 1, now=1.0)       # the one surge slot is held
    assert slots.take("a", "v2", SURGE, "one", 1, now=2.0)           # its holder renews it
    assert not slots.take("a", "v2", UNAVAILABLE, "two", 0, now=2.0)  # no unavailable replica allowed
    assert slots.take("a", "v3", SURGE, "two", 1, now=2.0)           # another deployment's slots are its own
    slots.give_back("a", "v2", "one")
    assert slots.take("a", "v2", SURGE, "two", 1, now=3.0)
    # A holder that died stops renewing: its hold lapses.
    assert slots.take("a", "v2", SURGE, "three", 1, now=3.0 + HOLD_S) and not slots.take(
        "a", "v2", SURGE, "two", 1, now=3.0 + HOLD_S)
