"""An API's `autoscaling` section as the scalers, placement, the API and beat read it."""

from __future__ import annotations

from foundation.api_registry import DeployedApi
from predictors_runtime.autoscaling_config import AutoscalingConfig
from predictors_runtime.config import ApiConfig


def autoscaling_of(deployed: DeployedApi) -> AutoscalingConfig:
    """The API's `autoscaling` section (Cortex's defaults when it has none)."""
    scaling = ApiConfig.from_dict(deployed.spec).autoscaling
    return scaling if scaling is not None else AutoscalingConfig.model_validate({"target_replica_concurrency": 1})
