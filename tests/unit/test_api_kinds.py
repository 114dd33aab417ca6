"""One vocabulary of API kinds (`foundation/api_kinds.py`): what the schemas accept is exactly it,
and a kind read back from JSON or Redis (a plain string) compares equal to its member."""

from __future__ import annotations

import json
import typing

from api import schemas
from foundation.api_kinds import KINDS, SCALED_KINDS, WORKER_KINDS, ApiKind
from predictors_runtime.config import ApiConfig


def test_the_schemas_accept_exactly_the_kinds() -> None:
    for model in (ApiConfig, schemas.Api):
        assert set(typing.get_args(model.model_fields["kind"].annotation)) == set(KINDS), model


def test_a_kind_read_from_json_is_its_member() -> None:
    assert json.loads(json.dumps({"kind": ApiKind.REALTIME}))["kind"] == ApiKind.REALTIME == "RealtimeAPI"
    assert {ApiKind.BATCH: "job"}.get("BatchAPI") == "job"


def test_every_kind_is_scaled_or_run_by_worker_nodes_and_only_async_is_both() -> None:
    assert set(SCALED_KINDS) | set(WORKER_KINDS) == set(KINDS)
    assert set(SCALED_KINDS) & set(WORKER_KINDS) == {ApiKind.ASYNC}
