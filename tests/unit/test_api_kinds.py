"""One vocabulary of API kinds (`foundation/api_kinds.py`): what the schemas accept is exactly it,
and a kind read back from JSON or Redis (a plain string) compares equal to its member."""

from __future__ import annotations

import json
import typing

from api import schemas
from foundation.api_kinds import KINDS, PREDICTOR_KINDS, SCALED_KINDS, WORKER_KINDS, ApiKind
from predictors_runtime.config import ApiConfig
from predictors_runtime.splitter_config import TrafficSplitterConfig


def test_the_schemas_accept_exactly_the_kinds() -> None:
    assert set(typing.get_args(schemas.Api.model_fields["kind"].annotation)) == set(KINDS)
    assert set(typing.get_args(ApiConfig.model_fields["kind"].annotation)) == set(PREDICTOR_KINDS)
    assert set(typing.get_args(TrafficSplitterConfig.model_fields["kind"].annotation)) == {ApiKind.TRAFFIC_SPLITTER}


def test_a_kind_read_from_json_is_its_member() -> None:
    assert json.loads(json.dumps({"kind": ApiKind.REALTIME}))["kind"] == ApiKind.REALTIME == "RealtimeAPI"
    assert {ApiKind.BATCH: "job"}.get("BatchAPI") == "job"


def test_every_kind_with_code_is_scaled_or_run_by_worker_nodes_and_only_async_is_both() -> None:
    assert set(SCALED_KINDS) | set(WORKER_KINDS) == set(PREDICTOR_KINDS) == set(KINDS) - {ApiKind.TRAFFIC_SPLITTER}
    assert set(SCALED_KINDS) & set(WORKER_KINDS) == {ApiKind.ASYNC}
