"""The API registry's contract (`foundation.api_registry.ApiRegistry`).

Fixtures a subclass provides: `registry` (empty) and `unreachable_registry` (one that cannot be
reached).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from foundation.api_registry import ApiRegistry
from foundation.errors import ApiNotFound
from predictors_runtime.config import ApiConfig


def config(name: str = "iris", kind: str = "BatchAPI", **predictor: Any) -> ApiConfig:
    return ApiConfig.from_dict({"name": name, "kind": kind, "predictor": {"path": "predictor.py", **predictor}})


class ApiRegistryContract:
    def test_a_deployed_api_reads_back_as_it_was_put(self, registry: ApiRegistry) -> None:
        api = config(config={"threshold": 0.5})

        deployed = registry.put(api, "sha256-abc", now=1_700_000_000.0)

        assert registry.get("iris") == deployed
        assert (deployed.name, deployed.kind, deployed.bundle, deployed.queue) == ("iris", "BatchAPI", "sha256-abc",
                                                                                 api.queue)
        assert deployed.deployed_at == 1_700_000_000.0
        assert deployed.spec == api.to_dict() and ApiConfig.from_dict(deployed.spec) == api
        assert deployed.ignored_fields == list(api.ignored_fields)

    def test_deploying_again_replaces_the_deployment(self, registry: ApiRegistry) -> None:
        registry.put(config(), "sha256-old", now=1.0)

        again = registry.put(config(config={"k": 1}), "sha256-new", now=2.0)

        assert registry.get("iris") == again
        assert (again.bundle, again.spec["predictor"]["config"]) == ("sha256-new", {"k": 1})
        assert [api.name for api in registry.all()] == ["iris"]

    def test_every_api_is_listed_by_name(self, registry: ApiRegistry) -> None:
        for name in ("zebra", "iris", "mnist"):
            registry.put(config(name, kind="RealtimeAPI"), "b")

        assert [api.name for api in registry.all()] == ["iris", "mnist", "zebra"]
        assert all(api.kind == "RealtimeAPI" for api in registry.all())

    def test_an_api_never_deployed_is_not_found(self, registry: ApiRegistry) -> None:
        assert registry.all() == []
        with pytest.raises(ApiNotFound, match="api nope is not deployed"):
            registry.get("nope")
        with pytest.raises(ApiNotFound, match="api nope is not deployed"):
            registry.delete("nope")

    def test_a_deleted_api_is_gone_and_the_others_stay(self, registry: ApiRegistry) -> None:
        registry.put(config("iris"), "b")
        registry.put(config("mnist"), "b")

        registry.delete("iris")

        with pytest.raises(ApiNotFound):
            registry.get("iris")
        assert [api.name for api in registry.all()] == ["mnist"]

    def test_a_deployment_read_back_is_a_copy(self, registry: ApiRegistry) -> None:
        deployed = registry.put(config(config={"k": [1]}), "b")
        deployed.spec["predictor"]["config"]["k"].append(2)

        assert registry.get("iris").spec["predictor"]["config"] == {"k": [1]}

    def test_every_deploy_and_delete_moves_the_generation_and_nothing_else_does(self, registry: ApiRegistry) -> None:
        seen = [registry.generation()]

        registry.put(config("iris"), "b1")
        seen.append(registry.generation())
        registry.get("iris")
        registry.all()
        assert registry.generation() == seen[-1]  # reading moves nothing
        registry.put(config("iris"), "b2")  # a redeploy
        seen.append(registry.generation())
        registry.delete("iris")
        seen.append(registry.generation())

        assert len(set(seen)) == 4

    def test_a_registry_that_cannot_be_reached_raises_a_connection_error(
        self, unreachable_registry: ApiRegistry,
    ) -> None:
        for call in (lambda: unreachable_registry.put(config(), "b"), lambda: unreachable_registry.get("iris"),
                     unreachable_registry.all, lambda: unreachable_registry.delete("iris"),
                     unreachable_registry.generation):
            with pytest.raises(redis.ConnectionError):
                call()

    def test_an_api_not_deployed_names_the_deployed_one_spelled_closest(self, registry: ApiRegistry) -> None:
        registry.put(config("summer"), "b")
        registry.put(config("iris"), "b")

        with pytest.raises(ApiNotFound, match=r"^api sumer is not deployed \(did you mean summer\?\)$"):
            registry.get("sumer")
        with pytest.raises(ApiNotFound, match=r"^api mnist is not deployed$"):  # nothing close: no guess
            registry.get("mnist")
