"""`from cortex_internal.lib.log import logger`, as Cortex documented it, gives Sluice's predictor logger."""

from foundation.json_logs import logger

__all__ = ["logger"]
