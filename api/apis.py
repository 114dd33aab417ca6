"""Deploy, list, get and delete APIs (`/apis`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from flask import Blueprint, jsonify, request

from jobs.enqueue import stop_job
from jobs.job import ACTIVE_STATUSES
from predictors_runtime.batch_predictor import resolve_model_paths
from predictors_runtime.config import ApiConfig, parse_api_configs
from predictors_runtime.errors import BadRequest, ConfigError, Conflict
from predictors_runtime.project import unpack_project

from .context import registry, services

blueprint = Blueprint("apis", __name__)

DEPLOYABLE_KINDS = ("BatchAPI",)


def _uploaded(name: str) -> bytes:
    upload = request.files.get(name)
    if upload is None:
        raise BadRequest(f"multipart field {name!r} is required (the CLI's `sluice deploy` sends it)")
    return upload.read()


def _validate_models(api: ApiConfig, project_dir: Path, source: str) -> None:
    """Refuse a model layout the predictor type cannot load, naming the path and the reason."""
    models = api.predictor.models
    if models is None:
        return
    from predictors_runtime.models.layout import discover

    try:
        discover(resolve_model_paths(models, project_dir), api.predictor.type)
    except ConfigError as e:
        message = e.message.replace(str(project_dir), "<project>")
        raise ConfigError(f"{source}: api {api.name}: predictor.models: {message}") from e


@blueprint.post("/apis")
def deploy():
    """Body: multipart with `config` (the cortex.yaml) and `project` (the packed project folder)."""
    config_upload = request.files.get("config")
    source = (config_upload.filename if config_upload is not None else None) or "cortex.yaml"
    try:
        config_text = _uploaded("config").decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"{source}: not UTF-8 text") from e
    project = _uploaded("project")
    apis = parse_api_configs(config_text, source=source)
    for api in apis:
        if api.kind not in DEPLOYABLE_KINDS:
            raise ConfigError(f"{source}: api {api.name}: kind {api.kind} cannot be deployed by this version")
    with tempfile.TemporaryDirectory(prefix="sluice-deploy-") as tmp:
        unpack_project(project, Path(tmp))
        for api in apis:
            if not (Path(tmp) / api.predictor.path).is_file():
                raise ConfigError(f"{source}: api {api.name}: predictor.path: {api.predictor.path} is not in the project folder")
            _validate_models(api, Path(tmp), source)
    bundle = services().bundles.put(project)
    deployed = [registry().put(api, bundle) for api in apis]
    return jsonify({"apis": [d.summary() for d in deployed]}), 201


@blueprint.get("/apis")
def list_apis():
    return jsonify({"apis": [api.summary() for api in registry().all()]})


@blueprint.get("/apis/<name>")
def get_api(name: str):
    return jsonify(registry().get(name).summary())


@blueprint.delete("/apis/<name>")
def delete_api(name: str):
    """Refuses while jobs run, unless `?force=true`, which stops them first."""
    api = registry().get(name)
    store = services().store
    active = [s for s in store.statuses(store.list_ids(api.name, limit=1000)).items() if s[1] in ACTIVE_STATUSES]
    if active and request.args.get("force", "").lower() != "true":
        raise Conflict(f"api {name} has {len(active)} running job(s); stop them or delete with ?force=true")
    for job_id, _ in active:
        stop_job(services(), store.get(job_id))
    registry().delete(name)
    return jsonify({"message": f"deleted api {name}", "stopped_jobs": [job_id for job_id, _ in active]})
