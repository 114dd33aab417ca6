"""The `autoscaling` section of a RealtimeAPI or AsyncAPI, read as Cortex wrote it.

Cortex projects carry this block, and its fields keep Cortex's names, defaults and rules so the
same file means the same thing here. What this module settles is the figures; the scaler that
acts on them (`jobs/scaling/algorithm.py` computes a replica count from them) is separate.

Durations are written as Cortex (Go) wrote them, `60s`, `5m`, `1h30m`, or as a number of
seconds, and are held as seconds. The window must be a whole number of the scaler's 10-second
ticks, because in-flight requests are sampled once a tick and averaged over the window.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, TypeAdapter, ValidationError, field_validator, model_validator

from predictors_runtime.config_base import ConfigModel, FieldProblem

# The scaler samples in-flight requests and decides once every tick (Cortex's interval).
TICK_S = 10
# Bounds: generous, but finite, so no value can overflow a timer or a replica count.
MAX_REPLICAS = 10_000
MAX_REPLICA_CONCURRENCY = 100_000
MAX_DURATION_S = 7 * 24 * 3600
MAX_UPSCALE_FACTOR = 1000.0

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_INT = TypeAdapter(int)


def parse_duration(value: Any) -> Any:
    """Seconds from a number or a Go duration string (`90s`, `1.5m`, `1h30m`, `500ms`).

    Anything else is returned unchanged for pydantic to refuse with its own message.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", text):
        return float(text)
    parts = list(_DURATION_PART.finditer(text))
    if not text or "".join(p.group(0) for p in parts) != text:
        raise ValueError(f"must be seconds or a duration such as '60s', '5m' or '1h30m' (got {value!r})")
    return sum(float(p.group(1)) * _UNIT_S[p.group(2)] for p in parts)


def format_duration(seconds: float) -> str:
    """Seconds as a short Cortex-style duration for messages: 45 -> `45s`, 90 -> `1m30s`."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"


def count_or(value: Any, default: int) -> int:
    """The integer pydantic reads from `value`, or `default` where it reads none.

    Defaults copied from another field (init_replicas from min_replicas, the target from the
    predictor's processes and threads) use it, so a bad value is reported once, on its own field.
    """
    try:
        return _INT.validate_python(value)
    except ValidationError:
        return default


class _BothTargets:
    """Stands for a target given under both of its names, until the target's validator refuses it."""


class AutoscalingConfig(ConfigModel):
    """How many replicas an API should run for the requests in flight (Cortex's fields)."""

    min_replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(default=100, ge=1, le=MAX_REPLICAS)
    # Replicas at deploy, before any request was counted (default: min_replicas).
    init_replicas: int = Field(ge=0, le=MAX_REPLICAS)
    # In-flight requests per replica the scaler aims for; the API config fills in Cortex's
    # default (the predictor's processes x threads). `target_in_flight` is Cortex v0.36's name.
    target_replica_concurrency: float = Field(gt=0, le=MAX_REPLICA_CONCURRENCY, allow_inf_nan=False)
    # Requests one replica holds, running plus queued at the proxy. None when not written: it is
    # then stored as None (not Cortex's 1024), so the proxy keeps `predictor.max_queue_length`'s
    # queue and a stored config reads back as written (`ApiConfig.replica_queue_length`).
    max_replica_concurrency: int | None = Field(default=None, ge=1, le=MAX_REPLICA_CONCURRENCY)
    window: float = Field(default=60.0, le=MAX_DURATION_S, allow_inf_nan=False)
    downscale_stabilization_period: float = Field(default=300.0, ge=0, le=MAX_DURATION_S, allow_inf_nan=False)
    upscale_stabilization_period: float = Field(default=60.0, ge=0, le=MAX_DURATION_S, allow_inf_nan=False)
    max_downscale_factor: float = Field(default=0.75, ge=0, lt=1, allow_inf_nan=False)
    max_upscale_factor: float = Field(default=1.5, gt=1, le=MAX_UPSCALE_FACTOR, allow_inf_nan=False)
    downscale_tolerance: float = Field(default=0.05, ge=0, allow_inf_nan=False)
    upscale_tolerance: float = Field(default=0.05, ge=0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _cortex_spellings_and_init(cls, data: Any) -> Any:
        """Read `target_in_flight` as the target, and start at min_replicas unless told otherwise."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "target_in_flight" in data:
            newer = data.pop("target_in_flight")
            # Both given: refused by the target's own validator, so the other fields still report.
            data["target_replica_concurrency"] = _BothTargets() if "target_replica_concurrency" in data else newer
        if "init_replicas" not in data:
            start = count_or(data.get("min_replicas", 1), 1)
            data["init_replicas"] = start if 0 <= start <= MAX_REPLICAS else 1
        return data

    @field_validator("target_replica_concurrency", mode="before")
    @classmethod
    def _one_target(cls, value: Any) -> Any:
        if isinstance(value, _BothTargets):
            raise ValueError("give either target_replica_concurrency or target_in_flight (its newer name), not both")
        return value

    _durations = field_validator(
        "window", "downscale_stabilization_period", "upscale_stabilization_period", mode="before"
    )(parse_duration)

    @field_validator("window")
    @classmethod
    def _whole_ticks(cls, value: float) -> float:
        """In-flight counts are sampled once a tick, so the window averages whole ticks."""
        if value <= 0 or value % TICK_S != 0:
            raise ValueError(
                f"must be a positive multiple of {TICK_S}s (got {format_duration(value)})"
            )
        return value

    @model_validator(mode="after")
    def _replica_bounds_agree(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise FieldProblem(
                "min_replicas", f"must be <= max_replicas ({self.min_replicas} > {self.max_replicas})"
            )
        if not self.min_replicas <= self.init_replicas <= self.max_replicas:
            raise FieldProblem(
                "init_replicas",
                f"must be between min_replicas and max_replicas ({self.min_replicas} to "
                f"{self.max_replicas}, got {self.init_replicas})",
            )
        if self.max_replica_concurrency is not None and self.target_replica_concurrency > self.max_replica_concurrency:
            raise FieldProblem(
                "target_replica_concurrency",
                f"must be <= max_replica_concurrency ({self.target_replica_concurrency:g} > "
                f"{self.max_replica_concurrency})",
            )
        return self
