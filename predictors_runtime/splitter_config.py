"""A `kind: TrafficSplitter` entry of cortex.yaml: one endpoint whose requests are shared among
RealtimeAPIs by weight, as Cortex had it (v0.25 onwards; `shadow` from v0.31).

    - name: iris
      kind: TrafficSplitter
      apis:
        - {name: iris-onnx, weight: 30}
        - {name: iris-tf, weight: 70}
        - {name: recorder, weight: 100, shadow: true}   # a copy of each request, answer dropped

The weights of the APIs that are not the shadow add up to 100 (Cortex's rule); a shadow's weight
is the percentage of requests copied to it. The splitter has no code and no replicas: the proxy
shares its requests (`sluice/proxy_config.py`), so it validates here and nowhere else runs it.
Whether each name is a deployed RealtimeAPI is the deploy's to check (`api/apis.py`), since the
file alone cannot say.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from foundation.api_kinds import ApiKind
from foundation.errors import ConfigError

from .config_base import ConfigModel, FieldProblem, checked_api_name

MAX_SPLIT_APIS = 32
WEIGHT_TOTAL = 100


class SplitTarget(ConfigModel):
    """One API a splitter shares its requests with."""

    name: str
    weight: int = Field(ge=0, le=WEIGHT_TOTAL)
    shadow: bool = False

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return checked_api_name(value)

    @field_validator("weight", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        """Cortex read weights as int32: 30.5 or "30" is an error, not a rounding."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number from 0 to {WEIGHT_TOTAL} (got {value!r})")
        return value


class TrafficSplitterConfig(ConfigModel):
    """A validated TrafficSplitter; `to_dict()` is the form stored in the registry."""

    name: str
    kind: Literal["TrafficSplitter"]
    apis: list[SplitTarget] = Field(min_length=1, max_length=MAX_SPLIT_APIS)
    ignored_fields: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return checked_api_name(value)

    @model_validator(mode="after")
    def _shares_add_up(self) -> TrafficSplitterConfig:
        names = [target.name for target in self.apis]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise FieldProblem("apis", f"each api may be named once (named more than once: {', '.join(repeated)})")
        if self.name in names:
            raise FieldProblem("apis", f"a TrafficSplitter cannot share requests with itself ({self.name})")
        shadows = [target.name for target in self.apis if target.shadow]
        if len(shadows) > 1:
            raise FieldProblem("apis", f"at most one api may be the shadow (shadow: {', '.join(shadows)})")
        total = sum(target.weight for target in self.apis if not target.shadow)
        if total != WEIGHT_TOTAL:
            raise FieldProblem("apis", f"the weights of the apis that are not the shadow must add up to "
                                       f"{WEIGHT_TOTAL} (they add up to {total})")
        return self

    @property
    def queue(self) -> str:
        """The registry files every API under a queue; a splitter's requests never reach one."""
        return "cpu"

    @property
    def shared(self) -> list[SplitTarget]:
        """The APIs that answer the splitter's requests (the shadow left out), weight > 0 or not."""
        return [target for target in self.apis if not target.shadow]

    @property
    def shadow(self) -> SplitTarget | None:
        return next((target for target in self.apis if target.shadow), None)

    @property
    def api_names(self) -> list[str]:
        """Every API the splitter sends requests to, the shadow included."""
        return [target.name for target in self.apis]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrafficSplitterConfig:
        """Rebuild a splitter stored by `to_dict`."""
        try:
            return cls.model_validate(d)
        except ValueError as e:
            raise ConfigError(f"stored TrafficSplitter ({d.get('name')}): {e}") from e


def is_splitter(spec: dict[str, Any]) -> bool:
    """Whether a stored spec is a TrafficSplitter's."""
    return spec.get("kind") == ApiKind.TRAFFIC_SPLITTER
