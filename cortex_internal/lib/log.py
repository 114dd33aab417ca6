"""`from cortex_internal.lib.log import logger`, as Cortex documented it, gives Sluice's predictor logger."""

from predictors_runtime.log import logger

__all__ = ["logger"]
