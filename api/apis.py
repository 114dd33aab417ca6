"""Deploy, list, get and delete APIs (`/apis`)."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from foundation.api_kinds import KINDS, ApiKind
from foundation.api_registry import DeployedApi
from foundation.environment_states import RedisEnvironmentStates
from foundation.errors import AccessDenied, BadRequest, ConfigError, Conflict, NotFound, SluiceError, did_you_mean
from foundation.figures import SPLIT_REQUESTS, read_figures
from foundation.replica_scale import RedisScaleBook
from jobs.batch.enqueue import stop_job
from jobs.batch.job import ACTIVE_STATUSES
from predictors_runtime.builder import resolve_model_paths
from predictors_runtime.config import ApiConfig, Deployment, parse_deployment
from predictors_runtime.environments import EnvironmentSpec, HostEnvironments, lock_environment, read_dependency_files
from predictors_runtime.environments.lock import index_arguments
from predictors_runtime.grpc_proto import check_proto, describe_proto, is_grpc
from predictors_runtime.import_check import unprovided_imports
from predictors_runtime.splitter_config import TrafficSplitterConfig
from predictors_runtime.storage import split_uri

from .batch import endpoint_url
from .context import figure_store, predictor_builds, registry, replica_directory, services
from .replica_counts import realtime_counts_of
from .schemas import Api, ApiList, DeleteApiQuery, Deleted, parse_query

log = logging.getLogger(__name__)

blueprint = Blueprint("apis", __name__)



def _uploaded(name: str) -> bytes:
    upload = request.files.get(name)
    if upload is None:
        raise BadRequest(f"multipart field {name!r} is required (the CLI's `sluice deploy` sends it)")
    return bytes(upload.read())


def _flag(name: str) -> bool:
    """A yes/no multipart field of the deploy (absent: no)."""
    value = (request.form.get(name) or "").strip().lower()
    if value not in ("", "0", "1", "true", "false"):
        raise BadRequest(f"multipart field {name!r} must be 1 or 0 (got {value!r})")
    return value in ("1", "true")


def _validate_models(api: ApiConfig, project_dir: Path, source: str) -> None:
    """Refuse a model layout the predictor type cannot load, naming the path and the reason."""
    models = api.predictor.models
    if models is None:
        return
    from predictors_runtime.models.layout import discover

    try:
        discover(resolve_model_paths(models, project_dir), api.predictor.type)
    except SluiceError as e:
        message = e.message.replace(str(project_dir), "<project>")
        # Folders of this host outside the project: name the configured path that failed and
        # why in general terms, never the files or folders found below it.
        configured = [models.path, models.dir, *(entry.path for entry in models.paths or ())]
        for path in (p for p in configured if p and not split_uri(p)[0] and Path(p).is_absolute()):
            if e.message.startswith(path.rstrip("/") + "/"):
                reason = f"does not hold models a {api.predictor.type} predictor can load"
                if isinstance(e, AccessDenied):
                    reason = "access denied below it"
                elif not isinstance(e, (ConfigError, NotFound)):
                    reason = "cannot be read"
                elif ": " in e.message:
                    # The layout rule that failed, without the sub-folder or the file names it found.
                    rule = e.message.split(": ", 1)[1].split(" (", 1)[0]
                    reason = f"a model folder below it breaks a layout rule: {rule}"
                message = f"{path}: {reason}"
        raise ConfigError(f"{source}: api {api.name}: predictor.models: {message}") from e


@blueprint.post("/apis")
def deploy() -> ResponseReturnValue:
    """Body: multipart with `config` (the cortex.yaml) and `project` (the packed project folder)."""
    config_upload = request.files.get("config")
    source = (config_upload.filename if config_upload is not None else None) or "cortex.yaml"
    try:
        config_text = _uploaded("config").decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"{source}: not UTF-8 text") from e
    project = _uploaded("project")
    deployment = parse_deployment(config_text, source=source)
    apis = deployment.apis
    for api in apis:
        if api.kind not in KINDS:
            raise ConfigError(f"{source}: api {api.name}: kind {api.kind} cannot be deployed by this version")
    already = registry().all()
    check_splits(deployment, already, source)
    environments: dict[str, dict[str, Any]] = {}
    deployed_environments = [EnvironmentSpec.from_dict(other.environment) for other in already
                             if other.environment]
    with tempfile.TemporaryDirectory(prefix="sluice-deploy-") as tmp:
        services().bundles.unpack(project, Path(tmp))  # within the limits on unpacked size and files
        for api in apis:
            if not (Path(tmp) / api.predictor.path).is_file():
                raise ConfigError(f"{source}: api {api.name}: {api.code_section}.path: {api.predictor.path} "
                                  "is not in the project folder")
            _validate_models(api, Path(tmp), source)
            _validate_proto(api, Path(tmp), source)
        compile_project(Path(tmp), source)
        warnings: dict[str, list[str]] = {}
        nearest_wheels = _flag("nearest_wheels")
        for api in apis:
            locked = lock_api_environment(api, Path(tmp), source, deployed_environments,
                                          nearest_wheels=nearest_wheels)
            if locked is not None:
                environments[api.name] = locked.to_dict()
            else:  # it runs in Sluice's own environment: what would it import that is not there?
                generated = generated_modules(api.predictor.protobuf_path)
                warnings[api.name] = [unprovided_warning(module) for module in
                                      unprovided_imports(Path(tmp), api.predictor.path)
                                      if module.split(" ", 1)[0] not in generated]
    bundle = services().bundles.put(project)
    deployed = [registry().put(api, bundle, environment=environments.get(api.name)) for api in apis]
    # After the APIs they name, so that no proxy routes a splitter to an API not yet registered.
    deployed += [registry().put(splitter, bundle) for splitter in deployment.splitters]
    for one in deployed:  # a new version: an earlier version's failed build is not its own
        predictor_builds().forget(one.name)
    now = time.time()
    for one in deployed:
        if one.kind == ApiKind.ASYNC:  # on its nodes now, so that its first request does not wait for beat
            place_async_api(one, now)
    if any(one.kind == ApiKind.REALTIME for one in deployed):
        place_realtime_replicas(now)
    for name, said in warnings.items():
        for warning in said:
            log.warning("api %s: %s", name, warning, extra={"api": name})
    answered = [{**view_of(d), **({"warnings": warnings[d.name]} if warnings.get(d.name) else {})} for d in deployed]
    return ApiList.model_validate({"apis": answered}).response(201)


def _validate_proto(api: ApiConfig, project_dir: Path, source: str) -> None:
    """A gRPC API's .proto compiles, holds one service, and is in the package named after the API
    (Cortex's rules), or the deploy is refused naming what is wrong."""
    protobuf_path = api.predictor.protobuf_path
    if protobuf_path is None:
        return
    with tempfile.TemporaryDirectory(prefix="sluice-proto-") as scratch:
        try:
            check_proto(describe_proto(project_dir, protobuf_path, Path(scratch)), api.name, protobuf_path)
        except ConfigError as e:  # the .proto's own error, or the grpc extra missing on this server
            raise ConfigError(f"{source}: api {api.name}: {e.message}") from e


def generated_modules(protobuf_path: str | None) -> set[str]:
    """The modules a replica generates from a gRPC API's .proto (its predictor may import them)."""
    if protobuf_path is None:
        return set()
    stem = Path(protobuf_path).stem
    return {f"{stem}_pb2", f"{stem}_pb2_grpc"}


def check_splits(deployment: Deployment, deployed: list[DeployedApi], source: str) -> None:
    """Refuse a TrafficSplitter naming anything but a RealtimeAPI of this file or one deployed (as
    Cortex did), and a deploy that would turn an API a deployed splitter names into another kind."""
    redeployed: dict[str, str] = {api.name: api.kind for api in deployment.apis}
    redeployed.update((splitter.name, splitter.kind) for splitter in deployment.splitters)
    kinds = {**{api.name: api.kind for api in deployed}, **redeployed}
    grpc = {api.name for api in deployed if api.kind == ApiKind.REALTIME and is_grpc(api.spec)}
    grpc = (grpc - redeployed.keys()) | {api.name for api in deployment.apis if api.predictor.protobuf_path}
    realtime = {name for name, kind in kinds.items() if kind == ApiKind.REALTIME} - grpc
    for splitter in deployment.splitters:
        for index, target in enumerate(splitter.apis):
            if target.name in realtime:
                continue
            where = f"{source}: api {splitter.name}: apis[{index}].name"
            if target.name in grpc:
                raise ConfigError(f"{where}: {target.name} is served over gRPC; a TrafficSplitter shares only HTTP "
                                  "requests (as on Cortex)")
            if target.name in kinds:
                raise ConfigError(f"{where}: {target.name} is a {kinds[target.name]}; a TrafficSplitter shares "
                                  "requests only among RealtimeAPIs")
            raise ConfigError(f"{where}: {target.name} is not a deployed RealtimeAPI and not one of this file"
                              + did_you_mean(target.name, realtime))
    turned_grpc = {api.name for api in deployment.apis if api.predictor.protobuf_path}
    for other in deployed:
        if other.kind != ApiKind.TRAFFIC_SPLITTER or other.name in redeployed:
            continue
        for name in TrafficSplitterConfig.from_dict(other.spec).api_names:
            if name in turned_grpc:
                raise ConfigError(f"{source}: api {name}: TrafficSplitter {other.name} shares HTTP requests with it, "
                                  f"so it cannot be served over gRPC (deploy {other.name} without it first)")
            if redeployed.get(name, ApiKind.REALTIME) != ApiKind.REALTIME:
                raise ConfigError(f"{source}: api {name}: TrafficSplitter {other.name} shares requests with it, "
                                  f"so it must stay a RealtimeAPI (deploy {other.name} without it first)")


def splitters_naming(name: str, deployed: list[DeployedApi]) -> list[str]:
    """The deployed TrafficSplitters that send requests to `name`."""
    return [api.name for api in deployed if api.kind == ApiKind.TRAFFIC_SPLITTER
            and name in TrafficSplitterConfig.from_dict(api.spec).api_names]


def unprovided_warning(module: str) -> str:
    """A deploy's warning about a module its predictor imports that Sluice's environment lacks."""
    return (f"imports {module}, which is not installed beside Sluice and the project has no requirements.txt: "
            "its first batch or request will fail to import it (add it to a requirements.txt)")


def compile_project(project_dir: Path, source: str) -> None:
    """Refuse a project with a Python file that cannot be compiled, naming the file, line and text:
    it would deploy cleanly and fail at its first batch or request otherwise."""
    for path in sorted(project_dir.rglob("*.py")):
        relative = path.relative_to(project_dir).as_posix()
        try:
            compile(path.read_bytes(), relative, "exec", dont_inherit=True)
        except SyntaxError as e:
            where = f"line {e.lineno}" + (f", column {e.offset}" if e.offset else "")
            text = (e.text or "").strip()
            raise ConfigError(f"{source}: {relative} {where}: {e.msg}" + (f": {text}" if text else "")) from e
        except ValueError as e:  # null bytes: not Python source
            raise ConfigError(f"{source}: {relative}: cannot be compiled: {e}") from e


def lock_api_environment(api: ApiConfig, project_dir: Path, source: str, deployed: list[EnvironmentSpec],
                         nearest_wheels: bool = False) -> EnvironmentSpec | None:
    """Resolve the API's requirements once, for every host to install the same versions (or reuse the
    lock of a `deployed` environment of the same requirements); None when its project installs
    nothing (it runs in Sluice's own environment, as always)."""
    files = read_dependency_files(project_dir, api, source)
    if files.empty:
        return None
    settings = services().settings
    started = time.monotonic()
    spec = lock_environment(
        files, project_dir, cache_dir=HostEnvironments.under(settings.cache_dir).uv_cache,
        where=f"{source}: api {api.name}",
        index_args=index_arguments(settings.package_index_url, settings.find_links, settings.no_index),
        deployed=deployed, nearest_wheels=nearest_wheels)
    for move in spec.moved:
        log.info("api %s: %s moved %s", api.name, files.pip_path, move, extra={"api": api.name})
    log.info("api %s: environment %s locked in %.2f s (%d packages)", api.name, spec.key, time.monotonic() - started,
             len(spec.resolved()), extra={"api": api.name, "environment": spec.key})
    return spec


def environment_view(api: DeployedApi, states: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The API's environment as `GET /apis` shows it: its key, the versions it resolved, and (in
    `GET /apis/<name>`) its state on each host that built it, with the build time or the error."""
    if not api.environment:
        return None
    view = EnvironmentSpec.from_dict(api.environment).summary()
    if states is not None:
        view["hosts"] = states
        failed = [s for s in states.values() if s.get("state") == "failed"]
        view["state"] = ("failed" if failed else "ready" if any(s.get("state") == "ready" for s in states.values())
                         else "building" if states else "locked")
        if failed:
            view["error"] = failed[0].get("error", "")
    return view


def view_of(api: DeployedApi, states: bool = False) -> dict[str, Any]:
    """`GET /apis`'s entry of one API (with `states`: its environment's state on each host, and the
    last failed build of its predictor, for `sluice get` to say which APIs are in error)."""
    view = {**api.summary(), "environment": environment_view(api, environment_states(api) if states else None)}
    if states:
        failure = predictor_builds().failure(api.name)
        if failure is not None:
            view["build_error"] = failure
    return view


def environment_states(api: DeployedApi) -> dict[str, dict[str, Any]] | None:
    """The API's environment on each host that has built it (None for an API without one)."""
    if not api.environment:
        return None
    return RedisEnvironmentStates(services().redis).states(str(api.environment.get("key", "")))


def place_async_api(api: DeployedApi, now: float) -> None:
    """Place a deployed AsyncAPI on its nodes; a Redis or broker error leaves it to beat's next step."""
    try:
        services().async_placement.place(api, now)
    except (SluiceError, redis.RedisError) as e:
        log.warning("placing async api %s failed (beat places it): %s", api.name, e)


def place_realtime_replicas(now: float) -> None:
    """Place every RealtimeAPI's replicas now (a new one's first replica does not wait for beat); a
    Redis error leaves it to beat's next step."""
    try:
        services().realtime_placement.reconcile(now)
    except (SluiceError, redis.RedisError) as e:
        log.warning("placing realtime replicas failed (beat places them): %s", e)


@blueprint.get("/apis")
def list_apis() -> ResponseReturnValue:
    return ApiList.model_validate({"apis": [view_of(api, states=True) for api in registry().all()]}).response()


def replicas_of(api: DeployedApi, now: float) -> list[dict[str, Any]]:
    """The live replicas of a realtime API, as `GET /apis/<name>` lists them."""
    return [
        {
            "id": r.replica_id, "address": r.address, "ready": r.ready, "draining": r.draining,
            "bundle": r.bundle, "message": r.message, "failing": r.failing,
            "last_oom_at": r.last_oom_at or None, "last_oom": r.last_oom or None, "devices": r.devices or None,
        }
        for r in replica_directory().live(now, api.name)
    ]


@blueprint.get("/apis/<name>")
def get_api(name: str) -> ResponseReturnValue:
    """The API's summary with its endpoint; a realtime API's also lists its replicas (launchers
    announce them) and its scaling (wanted, ready, per host), an AsyncAPI's its request counts, the
    nodes that serve it and its scaling."""
    api = registry().get(name)
    body = api.summary()
    body["endpoint"] = endpoint_url(api.name)
    failure = predictor_builds().failure(api.name)
    if failure is not None:
        body["build_error"] = failure
    if api.environment:
        body["environment"] = environment_view(api, environment_states(api))
    now = time.time()
    if api.kind == ApiKind.REALTIME:
        body["replicas"] = replicas_of(api, now)
        svc = services()
        placements = svc.realtime_placement.assignments.all()
        scale = RedisScaleBook(svc.redis).get(api.name)
        counts = realtime_counts_of([api], placements, {api.name: scale} if scale is not None else {},
                                    replica_directory().live(now, api.name))
        body["scaling"] = counts[api.name].to_dict()
    elif api.kind == ApiKind.TRAFFIC_SPLITTER:
        body["split"] = split_view(api, now)
    elif api.kind == ApiKind.ASYNC:
        svc = services()
        body["requests"] = svc.async_requests.counts(api.name, now).to_dict()
        placed = svc.async_placement.assignments.placed().get(api.name)
        live = svc.nodes.live(now)
        body["nodes"] = sorted(node for node in live if placed is not None and node in placed.nodes)
        if placed is not None:
            ready = len(body["nodes"])
            body["scaling"] = {"desired": placed.desired, "ready": ready, "pending": max(0, placed.desired - ready),
                               "in_flight": placed.in_flight}
    return Api.model_validate(body).response()


def split_view(splitter: DeployedApi, now: float) -> list[dict[str, Any]]:
    """A TrafficSplitter's APIs with their weights, what the proxies sent each (`SPLIT_REQUESTS`) and
    whether each can answer now."""
    config = TrafficSplitterConfig.from_dict(splitter.spec)
    totals = read_figures(figure_store(), [SPLIT_REQUESTS])[SPLIT_REQUESTS.name]
    sent = {}
    for target in config.apis:
        total = totals.get((splitter.name, target.name), 0)
        sent[target.name] = int(total) if isinstance(total, (int, float)) else 0
    answered = sum(sent[target.name] for target in config.shared)
    kinds = {api.name: api.kind for api in registry().all()}
    view = []
    for target in config.apis:
        if kinds.get(target.name) != ApiKind.REALTIME:
            state = "missing"
        else:
            ready = any(r.ready and not r.draining for r in replica_directory().live(now, target.name))
            state = "ready" if ready else "not_ready"
        view.append({"api": target.name, "weight": target.weight, "shadow": target.shadow, "sent": sent[target.name],
                     "share": sent[target.name] / answered if answered else None, "state": state})
    return view


@blueprint.delete("/apis/<name>")
def delete_api(name: str) -> ResponseReturnValue:
    """Refuses while jobs run, unless `?force=true`, which stops them first.

    A realtime API's launchers see it gone from the registry and stop its replicas.
    """
    force = parse_query(DeleteApiQuery).force
    api = registry().get(name)
    users = splitters_naming(name, registry().all())
    if users:
        raise Conflict(f"api {name} is used by TrafficSplitter {', '.join(users)}: delete that first, or deploy it "
                       f"without {name}")
    store = services().store
    active = [s for s in store.statuses(store.list_ids(api.name, limit=1000)).items() if s[1] in ACTIVE_STATUSES]
    if active and not force:
        raise Conflict(f"api {name} has {len(active)} running job(s); stop them or delete with ?force=true")
    for job_id, _ in active:
        stop_job(services(), store.get(job_id))
    registry().delete(name)
    predictor_builds().forget(name)
    if api.kind == ApiKind.REALTIME:
        place_realtime_replicas(time.time())
    return Deleted(message=f"deleted api {name}", stopped_jobs=[job_id for job_id, _ in active]).response()
