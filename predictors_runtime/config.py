"""Loading and validating `cortex.yaml`, the list of APIs a project deploys.

An existing Cortex project should deploy unchanged, so the reader accepts Cortex's spellings
(`handler:` for `predictor:`, `multi_model_reloading:` for `models:`) and Cortex fields that
mean nothing on Celery (networking, monitoring, ..., and `autoscaling` outside a RealtimeAPI or
AsyncAPI), which it lists in `ignored_fields` so the deploy can report them once. A RealtimeAPI's
or AsyncAPI's `autoscaling` is validated (`autoscaling_config.py`). Anything else it does not
know is an error: a typo should fail at deploy time, not be silently dropped. Every error names
the file, the API and the field path, because the user has to find the line to fix.
"""

from __future__ import annotations

import copy
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from foundation.api_kinds import KINDS, PREDICTOR_KINDS, SCALED_KINDS, ApiKind
from foundation.errors import ConfigError, did_you_mean
from foundation.hosts import BadQuantity, cpu_millis, mem_bytes
from foundation.limits import MAX_BATCH_TIMEOUT_S
from predictors_runtime.autoscaling_config import MAX_REPLICA_CONCURRENCY, AutoscalingConfig, count_or
from predictors_runtime.config_base import ConfigModel as _Model
from predictors_runtime.config_base import FieldProblem as _Problem
from predictors_runtime.config_base import checked_api_name
from predictors_runtime.config_yaml import read_api_list
from predictors_runtime.predictor_types import DEFAULT_TYPE, PREDICTOR_TYPES, PredictorTypeName
from predictors_runtime.splitter_config import TrafficSplitterConfig
from predictors_runtime.update_strategy import UpdateStrategy

# Predictor types an AsyncAPI's `server_side_batching` hands lists to (`predict(payload=[...])`).
ASYNC_BATCHING_TYPES = ("python", "onnx")
# A TaskAPI's `definition:` (Cortex's name for its code section) takes these fields, and is held
# as the API's `predictor` section (type python) so that one builder makes tasks and predictors.
TASK_DEFINITION_FIELDS = ("path", "config", "env", "python_path", "log_level", "dependencies")
# Cortex fields accepted for compatibility but without effect here, by section (`autoscaling`
# only for the kinds outside SCALED_KINDS, `update_strategy` outside a RealtimeAPI).
IGNORED_API_FIELDS = ("autoscaling", "networking", "update_strategy", "monitoring")
IGNORED_PREDICTOR_FIELDS = ("image", "tensorflow_serving_image", "shm_size")
# Bounds of the realtime fields: generous, but finite so no value can overflow a timer or a proxy setting.
MAX_PROCESSES = 64
MAX_THREADS = 1024
MAX_CONCURRENCY = 100_000
# Requests the proxy queues per replica when neither `max_queue_length` nor
# `autoscaling.max_replica_concurrency` says otherwise.
DEFAULT_QUEUE_LENGTH = 100
MAX_REQUEST_TIMEOUT_S = 24 * 3600
LOG_LEVELS = ("debug", "info", "warning", "error")



def _relative_path(value: str) -> str:
    """Reject paths that would reach outside the project folder the predictor runs in."""
    if not value:
        raise ValueError("must not be empty")
    if value.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", value):
        raise ValueError(f"must be relative to the project folder (got {value!r})")
    normal = posixpath.normpath(value.replace("\\", "/"))
    if normal == ".." or normal.startswith("../"):
        raise ValueError(f"must not leave the project folder (got {value!r})")
    return value


def _path_text(value: str | None) -> str | None:
    """A path reaches the file system and storage clients, which refuse NUL and lone surrogates."""
    if value is not None:
        if "\0" in value:
            raise ValueError("must not contain a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError("must be valid Unicode text (found a lone UTF-16 surrogate)") from e
    return value


class ModelPath(_Model):
    """One named model of a `paths:` list."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)

    _usable_path = field_validator("path")(_path_text)


class ModelsConfig(_Model):
    """Where the predictor's models live and how many of them to keep at once."""

    path: str | None = Field(default=None, min_length=1)
    paths: list[ModelPath] | None = None
    dir: str | None = Field(default=None, min_length=1)
    cache_size: int | None = Field(default=None, ge=1)
    disk_cache_size: int | None = Field(default=None, ge=1)
    signature_key: str | None = Field(default=None, min_length=1)

    _usable_paths = field_validator("path", "dir")(_path_text)

    @field_validator("paths")
    @classmethod
    def _names_unique(cls, paths: list[ModelPath] | None) -> list[ModelPath] | None:
        """Models are looked up by name, so two models of one name would shadow each other."""
        if paths is not None:
            if not paths:
                raise ValueError("must list at least one model")
            seen: set[str] = set()
            for i, entry in enumerate(paths):
                if entry.name in seen:
                    raise _Problem(f"[{i}].name", f"duplicate model name {entry.name!r}")
                seen.add(entry.name)
        return paths

    @model_validator(mode="after")
    def _one_source_and_sane_caches(self) -> ModelsConfig:
        """Exactly one source, and a disk cache that can hold what memory holds."""
        given = [k for k in ("path", "paths", "dir") if getattr(self, k) is not None]
        if len(given) != 1:
            found = ", ".join(given) if given else "none"
            raise ValueError(f"exactly one of path, paths or dir is required (found: {found})")
        if (
            self.cache_size is not None
            and self.disk_cache_size is not None
            and self.disk_cache_size < self.cache_size
        ):
            raise _Problem(
                "disk_cache_size",
                f"must be >= cache_size ({self.disk_cache_size} < {self.cache_size})",
            )
        return self


def _check_json(value: Any, where: str) -> None:
    """Predictor config travels to workers as JSON; reject what would not survive the trip."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Problem(where, f"keys must be strings (got {key!r})")
            _check_json(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]")
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise _Problem(where, f"must be a JSON value (got {type(value).__name__})")


class ServerSideBatching(_Model):
    """Requests gathered into one `predict` call of lists (Cortex's field): a realtime replica's
    concurrent requests, or an AsyncAPI's queued ones (`jobs/asyncapi/runner.py`)."""

    max_batch_size: int = Field(ge=1, le=MAX_THREADS)
    # Seconds the window stays open after its first request; Cortex wrote durations such as "100ms".
    batch_interval: float = Field(gt=0, le=60)

    @field_validator("batch_interval", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        """Accept seconds as a number, or a duration string: `100ms`, `0.1s`, `1m`."""
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*", value)
            if not match:
                raise ValueError(f"must be seconds or a duration such as '100ms' (got {value!r})")
            scale = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}[match.group(2)]
            return float(match.group(1)) * scale
        return value


class DependenciesConfig(_Model):
    """Where a project keeps what its API installs (Cortex v0.30's `predictor.dependencies`), each
    relative to the project folder; a file that is not there is not used."""

    pip: str = "requirements.txt"
    shell: str = "dependencies.sh"
    conda: str = "conda-packages.txt"

    @field_validator("pip", "shell", "conda")
    @classmethod
    def _inside_project(cls, value: str) -> str:
        return _relative_path(value)


class PredictorConfig(_Model):
    """How to load and run the user's predictor class."""

    type: PredictorTypeName = "python"
    path: str
    config: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    python_path: str | None = None
    models: ModelsConfig | None = None
    processes_per_replica: int = Field(default=1, ge=1, le=MAX_PROCESSES)
    threads_per_process: int = Field(default=1, ge=1, le=MAX_THREADS)
    log_level: str = "info"
    # None: the default file names (`DependenciesConfig()`); kept unset so existing specs do not change.
    dependencies: DependenciesConfig | None = None
    # Realtime only (a BatchAPI ignores them): requests one replica runs at once (default
    # processes x threads), requests it queues beyond that, and the bound on wait plus run.
    server_side_batching: ServerSideBatching | None = None
    max_concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)
    # None when not written (stored so, to tell it apart from `autoscaling.max_replica_concurrency`,
    # which sizes the queue when only it is written): DEFAULT_QUEUE_LENGTH then.
    max_queue_length: int | None = Field(default=None, ge=0, le=MAX_CONCURRENCY)
    request_timeout: float | None = Field(default=None, gt=0, le=MAX_REQUEST_TIMEOUT_S)
    # Batch only (a RealtimeAPI ignores it): seconds one try of a batch may run, unless the job says.
    batch_timeout: float | None = Field(default=None, gt=0, le=MAX_BATCH_TIMEOUT_S)
    # RealtimeAPI only: served over gRPC with the project's own service (Cortex v0.32-v0.35;
    # sluice/grpc_replica.py).
    protobuf_path: str | None = None

    @field_validator("path")
    @classmethod
    def _python_file_inside_project(cls, value: str) -> str:
        _relative_path(value)
        if not value.endswith(".py"):
            raise ValueError(f"must be a .py file (got {value!r})")
        return value

    @field_validator("python_path")
    @classmethod
    def _python_path_inside_project(cls, value: str | None) -> str | None:
        return None if value is None else _relative_path(value)

    @field_validator("protobuf_path")
    @classmethod
    def _proto_file_inside_project(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _relative_path(value)
        if not value.endswith(".proto"):
            raise ValueError(f"must be a .proto file (got {value!r})")
        return value

    @field_validator("config", "env", mode="before")
    @classmethod
    def _empty_section_is_empty(cls, value: Any) -> Any:
        """A YAML key whose entries are all commented out reads as null; treat it as empty."""
        return {} if value is None else value

    @field_validator("config")
    @classmethod
    def _config_is_json(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json(value, "")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_scalars_as_text(cls, value: Any) -> Any:
        """Cortex reads `PORT: 8080` as the string "8080"; so do we."""
        if not isinstance(value, dict):
            return value
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(item, bool):
                item = "true" if item else "false"
            elif isinstance(item, (int, float)):
                item = str(item)
            out[key] = item
        return out

    @field_validator("log_level")
    @classmethod
    def _known_log_level(cls, value: str) -> str:
        if value.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)} (got {value!r})")
        return value.lower()

    @model_validator(mode="after")
    def _models_fit_type(self) -> PredictorConfig:
        """TensorFlow and ONNX predictors are served from models; signatures are TF-only."""
        kind = PREDICTOR_TYPES[self.type]
        if kind.needs_models and self.models is None:
            raise _Problem("models", f"field required for type {self.type}")
        if self.models is not None and self.models.signature_key and not kind.takes_signature_key:
            takers = " or ".join(t.name for t in PREDICTOR_TYPES.values() if t.takes_signature_key)
            raise _Problem(
                "models.signature_key", f"only valid for type {takers} (type is {self.type})"
            )
        return self

    @property
    def replica_concurrency(self) -> int:
        """Requests one replica admits at once: `max_concurrency`, else processes x threads."""
        if self.max_concurrency is not None:
            return self.max_concurrency
        return self.processes_per_replica * self.threads_per_process


class ComputeConfig(_Model):
    """Resources one replica or node of an API takes: they choose the Celery queue (cpu, gpu or inf),
    and placement (`jobs/placement/realtime.py`) fits replicas into the room hosts offer with them.

    `cpu` defaults to Cortex's 200m, so that a small host holds several replicas as in Cortex; an
    API whose processes keep cores busy asks for what it uses.
    """

    cpu: float | str = "200m"
    gpu: int = Field(default=0, ge=0)
    inf: int = Field(default=0, ge=0)
    mem: str | None = None

    @field_validator("cpu", mode="plain")
    @classmethod
    def _positive_cpu(cls, value: Any) -> float | str:
        """Cortex accepts `1`, `0.5` and Kubernetes' `"200m"`; strings are kept as written."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"must be a number or a quantity such as '500m' (got {value!r})")
        if not isinstance(value, str) and not value > 0:
            raise ValueError(f"must be greater than 0 (got {value!r})")
        try:  # the grammar placement reads it with (foundation/hosts.py)
            millis = cpu_millis(value)
        except BadQuantity:
            raise ValueError(f"must be a number or a quantity such as '500m' (got {value!r})") from None
        if not millis > 0:  # rounded up, so only a zero amount is zero
            raise ValueError(f"must be greater than 0 (got {value!r})")
        return value if isinstance(value, str) else float(value)

    @field_validator("mem", mode="before")
    @classmethod
    def _memory_quantity(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str):
            try:
                mem_bytes(value)
            except BadQuantity:
                raise ValueError(f"must be a quantity such as '2G' or '512Mi' (got {value!r})") from None
        return value


class ApiConfig(_Model):
    """One API of a cortex.yaml, validated; `to_dict()` is the form stored and sent to workers."""

    name: str
    kind: Literal["BatchAPI", "RealtimeAPI", "TaskAPI", "AsyncAPI"]
    predictor: PredictorConfig
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    # Set for the SCALED_KINDS (Cortex's defaults when the file has no such section), else None.
    autoscaling: AutoscalingConfig | None = None
    # A RealtimeAPI's: how a redeploy replaces its replicas (Cortex's defaults when not written).
    update_strategy: UpdateStrategy | None = None
    ignored_fields: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return checked_api_name(value)

    @field_validator("kind", mode="before")
    @classmethod
    def _supported_kind(cls, value: Any) -> Any:
        if value not in PREDICTOR_KINDS:
            raise ValueError(f"unsupported kind {value!r} (supported kinds: {', '.join(KINDS)})")
        return value

    @field_validator("compute", mode="before")
    @classmethod
    def _empty_compute(cls, value: Any) -> Any:
        return {} if value is None else value

    @model_validator(mode="before")
    @classmethod
    def _autoscaling_defaults(cls, data: Any) -> Any:
        """A scaled kind always has an autoscaling section, whose target defaults, as on Cortex, to
        the requests one replica runs at once: the predictor's processes x threads."""
        if not isinstance(data, dict) or data.get("kind") not in SCALED_KINDS:
            return data
        section = data.get("autoscaling")
        section = {} if section is None else section
        if isinstance(section, dict) and not {"target_replica_concurrency", "target_in_flight"} & section.keys():
            predictor = data.get("predictor")
            predictor = predictor if isinstance(predictor, dict) else {}
            processes = count_or(predictor.get("processes_per_replica", 1), 1)
            threads = count_or(predictor.get("threads_per_process", 1), 1)
            # Clamped to the target's bounds: a processes or threads figure out of its own is
            # reported on its own field, not again as a target the user did not write.
            target = min(max(1, processes * threads), MAX_REPLICA_CONCURRENCY)
            section = {**section, "target_replica_concurrency": target}
        return {**data, "autoscaling": section}

    @model_validator(mode="after")
    def _autoscaling_fits_kind(self) -> ApiConfig:
        """Only an AsyncAPI can wait at zero replicas: its requests queue until a node serves them,
        while a realtime request needs a replica to answer it."""
        scaling = self.autoscaling
        if scaling is None:
            return self
        if self.kind not in SCALED_KINDS:
            raise _Problem("autoscaling",
                           f"only a {' or '.join(SCALED_KINDS)} has replicas to scale (kind is {self.kind})")
        if self.kind == ApiKind.REALTIME.value and scaling.min_replicas == 0:
            raise _Problem("autoscaling.min_replicas",
                           "must be at least 1 for a RealtimeAPI (only an AsyncAPI scales to zero)")
        return self

    @model_validator(mode="after")
    def _update_strategy_fits_kind(self) -> ApiConfig:
        if self.update_strategy is not None and self.kind != ApiKind.REALTIME.value:
            raise _Problem("update_strategy", f"only a RealtimeAPI's replicas are rolled (kind is {self.kind})")
        return self

    @property
    def rollout(self) -> UpdateStrategy:
        """The update strategy a redeploy follows: the one written, else Cortex's defaults."""
        return self.update_strategy or UpdateStrategy()

    @model_validator(mode="after")
    def _batching_fits_kind(self) -> ApiConfig:
        """A realtime replica's batch waits in its threads; an AsyncAPI's node takes queued requests."""
        batching = self.predictor.server_side_batching
        if batching is None:
            return self
        if self.kind == ApiKind.ASYNC.value:
            if self.predictor.type not in ASYNC_BATCHING_TYPES:
                # A TensorFlow predictor batches by gathering concurrent client calls; a node runs one call.
                raise _Problem("predictor.server_side_batching",
                               f"an AsyncAPI batches only predictors of type {' or '.join(ASYNC_BATCHING_TYPES)} "
                               f"(type is {self.predictor.type})")
            return self
        if batching.max_batch_size > self.predictor.threads_per_process:
            # Each waiting request holds one of the process's threads, so a batch can never be
            # larger than the thread count (Cortex had the same rule).
            raise _Problem(
                "predictor.server_side_batching.max_batch_size",
                f"must be <= threads_per_process ({batching.max_batch_size} > {self.predictor.threads_per_process})",
            )
        return self

    @model_validator(mode="after")
    def _grpc_fits_kind(self) -> ApiConfig:
        """Only a replica serves gRPC, and it runs each call on its own (Cortex's rules)."""
        if self.predictor.protobuf_path is None:
            return self
        if self.kind != ApiKind.REALTIME.value:
            raise _Problem("predictor.protobuf_path", f"only a RealtimeAPI is served over gRPC (kind is {self.kind})")
        if self.predictor.server_side_batching is not None:
            raise _Problem("predictor.server_side_batching", "cannot be used with protobuf_path (a gRPC API runs "
                           "each call on its own)")
        if self.predictor.processes_per_replica > 1:
            # The proxy carries its calls to a replica as streams of one HTTP/2 connection, which one
            # process accepts: a second process would sit idle.
            raise _Problem("predictor.processes_per_replica", "a gRPC replica serves from one process: with "
                           "protobuf_path, raise threads_per_process instead")
        return self

    @model_validator(mode="after")
    def _replica_limit_agrees(self) -> ApiConfig:
        """`autoscaling.max_replica_concurrency`, when written, bounds what one replica holds (running
        plus queued at the proxy): it must leave room for the requests the replica runs at once, and
        a `max_queue_length` written beside it must fit in what is left."""
        scaling = self.autoscaling
        if self.kind != ApiKind.REALTIME.value or scaling is None or scaling.max_replica_concurrency is None:
            return self
        limit, running = scaling.max_replica_concurrency, self.predictor.replica_concurrency
        runs_at_once = ("predictor.max_concurrency" if self.predictor.max_concurrency is not None
                        else "predictor.processes_per_replica x threads_per_process")
        if running > limit:
            raise _Problem("autoscaling.max_replica_concurrency",
                           f"must be >= the requests one replica runs at once, {runs_at_once} ({limit} < {running})")
        queue = self.predictor.max_queue_length
        if queue is not None and running + queue > limit:
            raise _Problem("predictor.max_queue_length",
                           f"conflicts with autoscaling.max_replica_concurrency: {runs_at_once} plus max_queue_length "
                           f"must be <= max_replica_concurrency ({running} + {queue} > {limit})")
        return self

    @property
    def replica_queue_length(self) -> int:
        """Requests the proxy queues per replica: `max_queue_length` as written; else what
        `autoscaling.max_replica_concurrency` leaves beyond the requests a replica runs at once; else
        DEFAULT_QUEUE_LENGTH."""
        if self.predictor.max_queue_length is not None:
            return self.predictor.max_queue_length
        scaling = self.autoscaling
        if self.kind == ApiKind.REALTIME.value and scaling is not None and scaling.max_replica_concurrency is not None:
            return max(0, scaling.max_replica_concurrency - self.predictor.replica_concurrency)
        return DEFAULT_QUEUE_LENGTH

    @property
    def code_section(self) -> str:
        """What the user calls the code section in cortex.yaml: `definition` for a TaskAPI."""
        return "definition" if self.kind == ApiKind.TASK.value else "predictor"

    @property
    def queue(self) -> str:
        """The Celery queue whose workers have the hardware this API asked for."""
        if self.compute.gpu > 0:
            return "gpu"
        if self.compute.inf > 0:
            return "inf"
        return "cpu"

    def to_dict(self) -> dict[str, Any]:
        """Every persisted field, JSON-serialisable; `from_dict` reads it back unchanged."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ApiConfig:
        """Rebuild a config stored by `to_dict` (canonical field names only)."""
        try:
            return cls.model_validate(d)
        except ValidationError as e:
            label = d.get("name") if isinstance(d, dict) else None
            prefix = (
                f"stored API config ({label})" if isinstance(label, str) else "stored API config"
            )
            raise ConfigError("; ".join(_describe(e, prefix, {}))) from e


def _fields_beside(loc: tuple[int | str, ...], top: type[BaseModel]) -> set[str]:
    """The field names the model holding `loc`'s last part takes, from the `top` model down (empty
    where that model is not found: a field of a free-form mapping)."""
    model: type[BaseModel] | None = top
    for part in loc[:-1]:
        if model is None:
            return set()
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) or next(
            (f for f in model.model_fields.values() if f.alias == part), None)
        model = _model_within(field.annotation) if field is not None else None
    if model is None:
        return set()
    return {field.alias or name for name, field in model.model_fields.items()}


def _model_within(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field's type holds (through Optional, unions, lists and mappings)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _model_within(argument)
        if found is not None:
            return found
    return None


def _describe(exc: ValidationError, prefix: str, spelling: dict[str, str],
              top: type[BaseModel] | None = None) -> list[str]:
    """Turn pydantic's errors into `<prefix>: <field.path>: <message>` lines.

    `spelling` maps canonical section names back to the ones the user wrote (e.g. handler); `top`
    is the model validated (an `ApiConfig` unless said).
    """
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        ctx = err.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, _Problem):
            loc.extend(part for part in cause.field.split(".") if part)
        if loc[:1] == ["predictor"]:
            loc[0] = spelling.get("predictor", "predictor")
            if loc[1:2] == ["models"]:
                loc[1] = spelling.get("models", "models")
        path = ""
        for part in loc:
            if isinstance(part, int) or str(part).startswith("["):
                path += f"[{part}]" if isinstance(part, int) else str(part)
            else:
                path += f".{part}" if path else str(part)
        kind = err["type"]
        if kind == "missing":
            message = "field required"
            if loc == [spelling.get("predictor", "predictor")]:
                message = "field required (spelled predictor or handler)"
        elif kind == "extra_forbidden":
            message = "unknown field" + did_you_mean(str(err["loc"][-1]), _fields_beside(err["loc"], top or ApiConfig))
        elif kind in ("value_error", "assertion_error") and cause is not None:
            message = str(cause)
        else:
            text = err["msg"]
            message = f"{text[:1].lower()}{text[1:]} (got {err.get('input')!r})"
        lines.append(f"{prefix}: {path}: {message}" if path else f"{prefix}: {message}")
    return lines


def _parse_one(raw: Any, index: int, source: str) -> tuple[ApiConfig | TrafficSplitterConfig | None, list[str]]:
    """Normalise Cortex spellings, set aside ignored fields, then validate one API."""
    if not isinstance(raw, dict):
        return None, [f"{source}: API #{index}: must be a mapping (got {type(raw).__name__})"]
    name = raw.get("name")
    prefix = f"{source}: API #{index}" + (f" ({name})" if isinstance(name, str) and name else "")
    problems: list[str] = []
    ignored_here = [k for k in IGNORED_API_FIELDS
                    if not (k == "autoscaling" and raw.get("kind") in SCALED_KINDS)
                    and not (k == "update_strategy" and raw.get("kind") == ApiKind.REALTIME)]
    ignored = [k for k in ignored_here if k in raw]
    data = {k: v for k, v in raw.items() if k not in ignored_here}
    if "ignored_fields" in data:
        problems.append(f"{prefix}: ignored_fields: unknown field")
        data.pop("ignored_fields")

    spelling: dict[str, str] = {}
    if data.get("kind") == ApiKind.TASK:
        return _parse_task(data, ignored, problems, prefix)
    if data.get("kind") == ApiKind.TRAFFIC_SPLITTER:
        return _parse_splitter(data, ignored, problems, prefix)
    present = [k for k in ("predictor", "handler") if k in data]
    if len(present) == 2:
        problems.append(f"{prefix}: handler: give either predictor or handler, not both")
        data.pop("handler")
    elif present == ["handler"]:
        spelling["predictor"] = "handler"
        data["predictor"] = data.pop("handler")
    section_key = spelling.get("predictor", "predictor")

    section = data.get("predictor")
    if isinstance(section, dict):
        section = dict(section)
        for key in IGNORED_PREDICTOR_FIELDS:
            if key in section:
                ignored.append(f"{section_key}.{key}")
                section.pop(key)
        if "multi_model_reloading" in section:
            if "models" in section:
                problems.append(
                    f"{prefix}: {section_key}.multi_model_reloading: "
                    "give either models or multi_model_reloading, not both"
                )
                section.pop("multi_model_reloading")
            elif section.get("type", DEFAULT_TYPE) != DEFAULT_TYPE:
                problems.append(
                    f"{prefix}: {section_key}.multi_model_reloading: only valid for type python "
                    f"(type is {section.get('type')}), use models"
                )
                section.pop("multi_model_reloading")
            else:
                spelling["models"] = "multi_model_reloading"
                section["models"] = section.pop("multi_model_reloading")
        data["predictor"] = section

    try:
        config = ApiConfig.model_validate(data)
    except ValidationError as e:
        return None, problems + _describe(e, prefix, spelling)
    if problems:
        return None, problems
    return config.model_copy(update={"ignored_fields": ignored}), []


def _parse_task(
    data: dict[str, Any], ignored: list[str], problems: list[str], prefix: str,
) -> tuple[ApiConfig | None, list[str]]:
    """A TaskAPI: its `definition:` (path, config, env, python_path, log_level) is held as a python
    `predictor` section; a `predictor:`/`handler:` section, or any other definition field, is an error."""
    for key in ("predictor", "handler"):
        if key in data:
            problems.append(f"{prefix}: {key}: unknown field (a TaskAPI's code is given as definition)")
            data.pop(key)
    section = data.pop("definition", None)
    if section is None:
        problems.append(f"{prefix}: definition: field required")
    elif not isinstance(section, dict):
        problems.append(f"{prefix}: definition: must be a mapping (got {type(section).__name__})")
    else:
        section = dict(section)
        for key in IGNORED_PREDICTOR_FIELDS:
            if key in section:
                ignored.append(f"definition.{key}")
                section.pop(key)
        problems.extend(f"{prefix}: definition.{key}: unknown field"
                        for key in section if key not in TASK_DEFINITION_FIELDS)
        data["predictor"] = {k: v for k, v in section.items() if k in TASK_DEFINITION_FIELDS}
    if "predictor" not in data:
        return None, problems
    try:
        config = ApiConfig.model_validate(data)
    except ValidationError as e:
        return None, problems + _describe(e, prefix, {"predictor": "definition"})
    if problems:
        return None, problems
    return config.model_copy(update={"ignored_fields": ignored}), []


def _parse_splitter(
    data: dict[str, Any], ignored: list[str], problems: list[str], prefix: str,
) -> tuple[TrafficSplitterConfig | None, list[str]]:
    """A TrafficSplitter: its `apis` and weights (`splitter_config.py`); any code section is an error."""
    for key in ("predictor", "handler", "definition", "compute"):
        if key in data:
            problems.append(f"{prefix}: {key}: unknown field (a TrafficSplitter has no code: it shares requests "
                            "among the RealtimeAPIs named in apis)")
            data.pop(key)
    try:
        config = TrafficSplitterConfig.model_validate(data)
    except ValidationError as e:
        return None, problems + _describe(e, prefix, {}, TrafficSplitterConfig)
    if problems:
        return None, problems
    return config.model_copy(update={"ignored_fields": ignored}), []


@dataclass(frozen=True)
class Deployment:
    """What one cortex.yaml deploys: its APIs with code, and its TrafficSplitters."""

    apis: list[ApiConfig]
    splitters: list[TrafficSplitterConfig]


def parse_api_configs(text: str, source: str = "cortex.yaml") -> list[ApiConfig]:
    """The APIs of a cortex.yaml that run code; a TrafficSplitter in it is an error here (the deploy
    reads both with `parse_deployment`)."""
    deployment = parse_deployment(text, source)
    if deployment.splitters:
        raise ConfigError(f"{source}: {deployment.splitters[0].name} is a TrafficSplitter: deploy it with "
                          "sluice deploy (only APIs with code are read here)")
    return deployment.apis


def parse_deployment(text: str, source: str = "cortex.yaml") -> Deployment:
    """Validate the text of a cortex.yaml; raise one `ConfigError` listing every problem."""
    items = read_api_list(text, source)
    configs: list[ApiConfig | TrafficSplitterConfig] = []
    problems: list[str] = []
    first_index: dict[str, int] = {}
    for index, raw in enumerate(items):
        config, found = _parse_one(raw, index, source)
        problems.extend(found)
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            if name in first_index:
                problems.append(
                    f"{source}: API #{index} ({name}): name: duplicate name, "
                    f"already used by API #{first_index[name]}"
                )
            else:
                first_index[name] = index
        if config is not None:
            configs.append(config)
    if problems:
        raise ConfigError("; ".join(problems))
    return Deployment(apis=[c for c in configs if isinstance(c, ApiConfig)],
                      splitters=[c for c in configs if isinstance(c, TrafficSplitterConfig)])


def load_api_configs(config_path: Path) -> list[ApiConfig]:
    """Read and validate a cortex.yaml file."""
    try:
        text = Path(config_path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{config_path}: cannot read the API configuration: {e}") from e
    return parse_api_configs(text, source=str(config_path))


def merge_config(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `override` over `base` (a job's config over its API's); inputs are untouched.

    Nested mappings merge key by key; any other value in `override`, lists included, replaces
    the one in `base`. The result shares no mutable object with the inputs.
    """
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def cortex_api_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A stored API spec (`ApiConfig.to_dict()`) as Cortex showed it: a TaskAPI's code section under
    `definition`, with only the fields a definition takes; any other kind's as stored."""
    if spec.get("kind") != ApiKind.TASK or "predictor" not in spec:
        return spec
    shown = {key: value for key, value in spec.items() if key != "predictor"}
    shown["definition"] = {key: value for key, value in spec["predictor"].items() if key in TASK_DEFINITION_FIELDS}
    return shown
