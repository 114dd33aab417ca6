"""Building a user's predictor: the one way batch workers and realtime replicas make one.

The builder does what is common to both modes: it reads the project's `.env` and
`predictor.env`, sets up the API version's namespace (environment, import path, modules,
working directory; see `namespace.py`), imports the predictor class inside it, makes the
model client of the predictor type, binds the python client's `load_model` before `__init__`
runs, constructs the instance with the arguments its `__init__` declares, and starts live
reloading. What a mode offers the constructor comes in as `init_args`: a batch job offers
`config` (merged with the job's) and `job_spec`, a realtime replica offers `config`.

Callers run every later call into the user's code inside `built.namespace.active()` (a batch
worker, one job after another) or `install()` it once (a replica serving one API). Live
reloading calls `load_model` from its polling thread, which sees whichever namespace is in place
at that moment: in a replica always its own; in a batch worker its own during the job's batches,
the process's own between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from foundation.api_kinds import ApiKind
from foundation.errors import PredictorError, SluiceError

from .config import ApiConfig, ModelsConfig
from .extras import require_predictor_runtime
from .loader import PREDICTOR_CLASS_NAMES, TASK_CLASS_NAMES, call_with_declared, error_text, load_predictor_class
from .namespace import ApiNamespace
from .predictor_types import PREDICTOR_TYPES
from .project import read_dotenv
from .storage import split_uri

SUPPORTED_TYPES = tuple(PREDICTOR_TYPES)


def resolve_model_paths(models: ModelsConfig, project_dir: Path) -> ModelsConfig:
    """Relative local model paths name folders inside the project (shipped with its bundle)."""

    def resolve(path: str) -> str:
        if split_uri(path)[0] or Path(path).is_absolute():
            return path
        return str((project_dir / path).resolve())

    update: dict[str, Any] = {}
    if models.path is not None:
        update["path"] = resolve(models.path)
    if models.dir is not None:
        update["dir"] = resolve(models.dir)
    if models.paths is not None:
        update["paths"] = [p.model_copy(update={"path": resolve(p.path)}) for p in models.paths]
    return models.model_copy(update=update)


def make_client(api: ApiConfig, project_dir: Path, model_cache_dir: Path, poll_interval_s: float) -> Any:
    """The model client a predictor of this type receives, or None for a python predictor without models."""
    predictor = api.predictor
    if predictor.models is None:
        return None
    require_predictor_runtime(predictor.type)
    from .clients import client_for
    from .models.manager import ModelManager

    models = resolve_model_paths(predictor.models, project_dir)

    def manager_factory(load: Any) -> ModelManager:
        return ModelManager(models, predictor.type, model_cache_dir, load, poll_interval_s=poll_interval_s,
                            api_name=api.name)

    return client_for(predictor.type, manager_factory, signature_key=models.signature_key, gpu=api.compute.gpu > 0)


def api_environment(project_dir: Path, api: ApiConfig) -> dict[str, str]:
    """The variables an API's code gets on top of the process's: `.env`, then `predictor.env` over it."""
    try:
        env = read_dotenv(project_dir)
    except SluiceError as e:
        raise PredictorError(f"reading the project's .env failed: {e.message}") from e
    env.update({key: str(value) for key, value in api.predictor.env.items()})
    return env


def api_namespace(project_dir: Path, api: ApiConfig) -> ApiNamespace:
    """A fresh namespace for one API version: its environment, `python_path`, then its project folder."""
    python_path = api.predictor.python_path
    extra = [(project_dir / python_path).resolve()] if python_path is not None else []
    return ApiNamespace(project_dir, api_environment(project_dir, api), extra)


@dataclass(eq=False)
class BuiltPredictor:
    """A constructed user predictor with what it was built with; call its code inside `namespace`."""

    instance: Any
    client: Any
    namespace: ApiNamespace
    api: ApiConfig
    project_dir: Path
    _closed: bool = field(default=False, repr=False)

    def method(self, *names: str) -> Callable[..., Any] | None:
        """The first of `names` the instance has as a callable (bound method), or None."""
        with self.namespace.active():  # a property or __getattr__ of the user's runs in its namespace
            for name in names:
                found: Callable[..., Any] | None = getattr(self.instance, name, None)
                if callable(found):
                    return found
        return None

    def close(self) -> None:
        """Stop live reloading and let go of the namespace's modules; the predictor is done with."""
        if self._closed:
            return
        self._closed = True
        if self.client is not None:
            self.client.stop_reloading()
        self.namespace.close()


# The name Cortex 0.34 and 0.35 gave the model client in a handler's constructor.
CORTEX_CLIENT_ALIAS = "model_client"


def build_predictor(
    project_dir: Path, api: ApiConfig, init_args: Mapping[str, Any], *,
    model_cache_dir: Path, poll_interval_s: float,
) -> BuiltPredictor:
    """Import the predictor in a fresh namespace of its API version and construct it.

    `init_args` are what the mode offers `__init__` by name (`config`, `job_spec`); the model
    client is offered as `python_client` / `onnx_client` / `tensorflow_client` when the API has
    models. `__init__` gets only what it declares. Raises `PredictorError` carrying the user's
    traceback when the import or `__init__` fails; nothing of the namespace stays in place.
    """
    predictor = api.predictor
    if predictor.type not in SUPPORTED_TYPES:
        raise PredictorError(f"predictor type {predictor.type!r} is not supported by this worker")
    namespace = api_namespace(project_dir, api)
    try:
        with namespace.active():
            instance, client = _construct(project_dir, api, init_args, model_cache_dir, poll_interval_s)
    except BaseException:
        namespace.close()
        raise
    if client is not None:
        client.start_reloading()
    return BuiltPredictor(instance, client, namespace, api, project_dir)


def _construct(
    project_dir: Path, api: ApiConfig, init_args: Mapping[str, Any], model_cache_dir: Path, poll_interval_s: float,
) -> tuple[Any, Any]:
    """Inside the namespace: the predictor instance and its model client (or None)."""
    predictor = api.predictor
    # One module per (project folder, tag): two versions of one API never share module state.
    class_names = TASK_CLASS_NAMES if api.kind == ApiKind.TASK.value else PREDICTOR_CLASS_NAMES
    predictor_class: Any = load_predictor_class(project_dir, predictor.path, module_tag=str(project_dir),
                                                class_names=class_names)
    available: dict[str, Any] = dict(init_args)
    try:
        client = make_client(api, project_dir, model_cache_dir, poll_interval_s)
    except SluiceError as e:
        raise PredictorError(f"preparing the model client failed: {e.message}") from e
    # Made before __init__ runs, so the python client can call load_model from __init__.
    instance = predictor_class.__new__(predictor_class)
    if client is not None:
        if predictor.type == "python":
            load_model = getattr(instance, "load_model", None)
            if not callable(load_model):
                raise PredictorError(
                    f"{predictor_class.__name__} needs a load_model(self, model_path) method "
                    "to use predictor.models (multi_model_reloading)"
                )
            client.bind(load_model)
        available[PREDICTOR_TYPES[predictor.type].client_argument] = client
        # Cortex 0.34 and 0.35 handed a handler its client as `model_client` (a python handler with
        # multi_model_reloading): offered under both names, the constructor takes the one it declares.
        available.setdefault(CORTEX_CLIENT_ALIAS, client)
    try:
        if predictor_class.__init__ is not object.__init__:  # a class may define no constructor
            call_with_declared(instance.__init__, available)
    except PredictorError:
        raise
    except BaseException as e:
        raise PredictorError(f"{predictor_class.__name__}.__init__ raised: {error_text(e)}") from e
    return instance, client
