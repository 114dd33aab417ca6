"""Finding the models of an API in storage and checking that their predictor type can load them.

A model folder holds either one model, or integer-named version folders (the highest is the
latest). It is *versioned* when every immediate child is a folder named by an integer (at least
one) and no file sits directly in it; its versions are those integers. Any other folder is one
unversioned model, exposed as version 1. `dir` holds one model per immediate sub-folder, named
by the folder; files directly in `dir` are not models and are left alone.

Each version carries a fingerprint: its files with the version the storage reports for each
(mtime and size locally, ETag or MD5 on S3/GCS). Equal fingerprints mean unchanged, which is
how live reloading notices a version added, removed, restructured or rewritten in place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from foundation.errors import ConfigError
from predictors_runtime.config import ModelsConfig
from predictors_runtime.predictor_types import PREDICTOR_TYPES as _REGISTRY
from predictors_runtime.predictor_types import predictor_type as _predictor_type
from predictors_runtime.storage import ObjectInfo, join_uri, storage_for

DEFAULT_MODEL_NAME = "_default"
PREDICTOR_TYPES = tuple(_REGISTRY)
_VERSION_RE = re.compile(r"^\d+$")


@dataclass(frozen=True)
class ModelVersion:
    """One version of one model: where it lives and the fingerprint of its files."""

    name: str
    version: int
    uri: str  # the folder of this version (the model folder itself when unversioned)
    files: tuple[tuple[str, str], ...]  # sorted (path relative to `uri`, storage version)


Versions = dict[str, dict[int, ModelVersion]]


@dataclass(frozen=True)
class LayoutProblem:
    """Why `scan` left out a model (`version` None: its folder is missing or empty) or one version."""

    name: str
    version: int | None
    message: str


def _relative_files(uri: str, infos: Iterable[ObjectInfo]) -> tuple[str, list[tuple[str, str]]]:
    """`(folder URI without trailing slash, [(relative path, version)])` of the objects under `uri`.

    Zero-byte folder markers ("a/b/") and an object exactly at `uri` (a file, not a folder) are
    left out.
    """
    base = storage_for(uri).canonical(uri).rstrip("/")
    prefix = base + "/"
    files: list[tuple[str, str]] = []
    for info in infos:
        if not info.uri.startswith(prefix):
            continue
        relative = info.uri[len(prefix):]
        if relative and not relative.endswith("/"):
            files.append((relative, info.version))
    return base, files


def _listing(uri: str, what: str) -> tuple[str, list[tuple[str, str]]]:
    """List `uri` once; a missing or empty folder is a `ConfigError` naming it."""
    storage = storage_for(uri)
    infos = list(storage.list(uri))
    base, files = _relative_files(uri, infos)
    if not files:
        if any(info.uri == storage.canonical(uri) for info in infos):
            raise ConfigError(f"{uri}: {what} must be a folder, not a file")
        raise ConfigError(f"{uri}: {what} is missing or empty")
    return base, files


def _sub_folders(files: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Files grouped by the sub-folder they are in, with paths relative to it; top-level files dropped."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for relative, version in files:
        head, slash, rest = relative.partition("/")
        if slash:
            groups.setdefault(head, []).append((rest, version))
    return groups


def model_sources(models: ModelsConfig) -> dict[str, str]:
    """Model name -> model folder URI: `path` gives one model named `DEFAULT_MODEL_NAME`,
    `paths` the names given, `dir` one model per immediate sub-folder (listed in storage)."""
    if models.path is not None:
        return {DEFAULT_MODEL_NAME: models.path}
    if models.paths is not None:
        return {entry.name: entry.path for entry in models.paths}
    if models.dir is None:
        raise ConfigError("predictor.models: exactly one of path, paths or dir is required")
    base, files = _listing(models.dir, "the models dir")
    names = sorted(_sub_folders(files))
    if not names:
        raise ConfigError(f"{models.dir}: the models dir holds no model folders")
    return {name: join_uri(base, name) for name in names}


def _check(uri: str, files: list[tuple[str, str]], predictor_type: str) -> None:
    """Raise `ConfigError` naming `uri` when `predictor_type` cannot load a version with these files."""
    names = [relative for relative, _ in files]
    if predictor_type == "onnx":
        found = [n for n in names if "/" not in n and n.lower().endswith(".onnx")]
        if len(found) != 1:
            listed = f" ({', '.join(found)})" if found else ""
            raise ConfigError(f"{uri}: an ONNX model needs exactly one *.onnx file, found {len(found)}{listed}")
    elif predictor_type == "tensorflow":
        missing = []
        if "saved_model.pb" not in names:
            missing.append("saved_model.pb")
        if not any(n.startswith("variables/") for n in names):
            missing.append("a variables/ folder with at least one file")
        if missing:
            raise ConfigError(f"{uri}: a TensorFlow SavedModel needs saved_model.pb and variables/, "
                              f"missing {' and '.join(missing)}")
    else:
        _predictor_type(predictor_type)  # python (any files its load_model reads), or not a type at all
        if not files:
            raise ConfigError(f"{uri}: the model folder is empty")


def _versions_of(name: str, base: str, files: list[tuple[str, str]]) -> dict[int, tuple[str, list[tuple[str, str]]]]:
    """version -> (folder URI, files relative to it) for one model folder."""
    top_level_files = any("/" not in relative for relative, _ in files)
    groups = _sub_folders(files)
    if groups and not top_level_files and all(_VERSION_RE.match(folder) for folder in groups):
        by_version: dict[int, tuple[str, list[tuple[str, str]]]] = {}
        for folder, inner in groups.items():
            number = int(folder)
            if number in by_version:  # "1" and "01" name the same version
                other = by_version[number][0]
                raise ConfigError(f"{join_uri(base, folder)}: model {name} has version {number} twice (also {other})")
            by_version[number] = (join_uri(base, folder), inner)
        return by_version
    return {1: (base, files)}


def _model(name: str, base: str, files: list[tuple[str, str]], predictor_type: str,
           problems: list[LayoutProblem] | None) -> dict[int, ModelVersion]:
    """The checked versions of one model; a bad one raises, or with `problems` is reported and skipped."""
    out: dict[int, ModelVersion] = {}
    for number, (uri, inner) in sorted(_versions_of(name, base, files).items()):
        try:
            _check(uri, inner, predictor_type)
        except ConfigError as e:
            if problems is None:
                raise
            problems.append(LayoutProblem(name, number, e.message))
            continue
        out[number] = ModelVersion(name=name, version=number, uri=uri, files=tuple(sorted(inner)))
    return out


def scan(models: ModelsConfig, predictor_type: str, problems: list[LayoutProblem] | None = None) -> Versions:
    """Like `discover`; with a `problems` list, a bad or empty model or version is described
    there and left out instead of raising (live reloading keeps what it has for it)."""
    _predictor_type(predictor_type)
    found: Versions = {}
    if models.dir is not None:
        base, files = _listing(models.dir, "the models dir")
        groups = _sub_folders(files)
        if not groups:
            raise ConfigError(f"{models.dir}: the models dir holds no model folders")
        for name, inner in sorted(groups.items()):
            found[name] = _model(name, join_uri(base, name), inner, predictor_type, problems)
        return found
    for name, uri in model_sources(models).items():
        try:
            base, files = _listing(uri, f"the folder of model {name}")
        except ConfigError as e:
            if problems is None:
                raise
            problems.append(LayoutProblem(name, None, e.message))
            continue
        found[name] = _model(name, base, files, predictor_type, problems)
    return found


def discover(models: ModelsConfig, predictor_type: str) -> Versions:
    """Every model and version of the API, checked for `predictor_type`: name -> version -> `ModelVersion`.

    One storage listing per source. Raises `ConfigError` naming the URI and the reason for a
    missing or empty path or dir, and for a version its predictor type cannot load (ONNX: exactly
    one `*.onnx` at the top; TensorFlow: `saved_model.pb` and files under `variables/`; Python:
    any files).
    """
    return scan(models, predictor_type)
