"""A RealtimeAPI's `update_strategy`, as Cortex wrote it: how a redeploy replaces its replicas.

`max_surge`: how many replicas may run above the desired count while the new version starts;
`max_unavailable`: how many below it while old ones make room. Each is a count or a percentage
of the desired replicas (Cortex's defaults: 25% and 25%), resolved as Kubernetes resolves a
Deployment's: a surge rounds up, an unavailability down, and when both come to zero one replica
may be unavailable, so that a redeploy always moves. Placement honours them through rollout slots
(`foundation/rollout_slots.py`) that each replica's launcher takes before it replaces its replica.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import field_validator, model_validator

from predictors_runtime.config_base import ConfigModel, FieldProblem

DEFAULT = "25%"
_PERCENT = re.compile(r"^(\d{1,3})%$")


def _checked(value: Any) -> int | str:
    if isinstance(value, bool):
        raise ValueError(f"must be a count of replicas or a percentage such as '25%' (got {value!r})")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must not be negative (got {value})")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        match = _PERCENT.match(text)
        if match and int(match.group(1)) <= 100:
            return f"{int(match.group(1))}%"
    raise ValueError(f"must be a count of replicas or a percentage from 0% to 100% such as '25%' (got {value!r})")


def _resolve(value: int | str, replicas: int, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = int(value[:-1]) * replicas / 100
    return math.ceil(share) if round_up else math.floor(share)


class UpdateStrategy(ConfigModel):
    """How many replicas a redeploy may add (`max_surge`) and take away (`max_unavailable`) at once."""

    max_surge: int | str = DEFAULT
    max_unavailable: int | str = DEFAULT

    @field_validator("max_surge", "max_unavailable", mode="before")
    @classmethod
    def _count_or_percent(cls, value: Any) -> int | str:
        return _checked(value)

    @model_validator(mode="after")
    def _moves(self) -> UpdateStrategy:
        if self.max_surge in (0, "0%") and self.max_unavailable in (0, "0%"):
            raise FieldProblem("max_unavailable", "max_surge and max_unavailable cannot both be 0: a redeploy "
                                                  "could then replace no replica")
        return self

    def bounds(self, replicas: int) -> tuple[int, int]:
        """(replicas that may be added, replicas that may be missing) for `replicas` desired."""
        replicas = max(1, replicas)
        surge = _resolve(self.max_surge, replicas, round_up=True)
        unavailable = _resolve(self.max_unavailable, replicas, round_up=False)
        if surge == 0 and unavailable == 0:
            unavailable = 1
        return surge, unavailable
