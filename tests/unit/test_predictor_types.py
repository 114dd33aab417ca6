"""One registry of predictor types: config, builder, clients and models layout all agree with it."""

from __future__ import annotations

from typing import get_args

import pytest

from foundation.errors import ConfigError
from predictors_runtime import builder
from predictors_runtime.clients import CLIENT_ARGUMENT, CLIENTS
from predictors_runtime.models import layout
from predictors_runtime.predictor_types import PREDICTOR_TYPES, PredictorTypeName, predictor_type


def test_the_config_schema_accepts_exactly_the_registered_types() -> None:
    assert sorted(get_args(PredictorTypeName)) == sorted(PREDICTOR_TYPES)


def test_every_registered_type_has_a_model_client_and_is_built_and_laid_out() -> None:
    assert set(CLIENTS) == set(PREDICTOR_TYPES)
    assert {name: kind.client_argument for name, kind in PREDICTOR_TYPES.items()} == CLIENT_ARGUMENT
    assert set(builder.SUPPORTED_TYPES) == set(PREDICTOR_TYPES)
    assert set(layout.PREDICTOR_TYPES) == set(PREDICTOR_TYPES)


def test_an_unknown_type_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="'torch' is not one of python, onnx, tensorflow"):
        predictor_type("torch")
