"""A gRPC API's own `.proto` (`predictor.protobuf_path`, Cortex v0.32-v0.35), compiled with grpcio-tools.

The deploy reads what the file declares without importing anything (`describe_proto`: its
package and services, from a descriptor set), so that a file that does not compile, holds more or
less than one service, or names a package other than the API's is refused at once, as Cortex
refused it. A gRPC replica compiles it into Python modules and imports them (`compile_proto`).

Cortex's rule, kept: the package is the API's name with `-` spelled `_` (`iris-classifier` ->
`iris_classifier`), so every RPC path of the API begins `/<package>.`, which is how the proxy
routes gRPC calls to the API's replicas (`grpc_path_prefix`).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from foundation.errors import ConfigError

from .extras import needs_extra


class ProtoError(ConfigError):
    """The project's .proto cannot be served: it does not compile, or holds no single service."""


@dataclass(frozen=True)
class Service:
    """The one service of a compiled .proto."""

    full_name: str                                  # package.Service: the RPC paths' prefix
    methods: tuple[str, ...]                         # its RPCs, by name
    servicer: type                                   # the generated <Service>Servicer base class
    add_to_server: Callable[[Any, Any], None]        # the generated add_<Service>Servicer_to_server
    messages: ModuleType                             # <stem>_pb2


def compile_proto(project_dir: Path, protobuf_path: str, out_dir: Path) -> tuple[ModuleType, ModuleType]:
    """Compile the project's .proto into `out_dir` with grpcio-tools and import the two modules it
    makes (`out_dir` goes first on the import path: the process serves this one API for life)."""
    source = _source(project_dir, protobuf_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    _protoc(source, protobuf_path, [f"--python_out={out_dir}", f"--grpc_python_out={out_dir}"])
    if str(out_dir) not in sys.path:
        sys.path.insert(0, str(out_dir))
    stem = source.stem
    importlib.invalidate_caches()
    return importlib.import_module(f"{stem}_pb2"), importlib.import_module(f"{stem}_pb2_grpc")


def service_of(messages: ModuleType, stubs: ModuleType, protobuf_path: str) -> Service:
    """The .proto's one service, as the generated modules spell it."""
    services = list(messages.DESCRIPTOR.services_by_name.values())
    if len(services) != 1:
        raise ProtoError(f"predictor.protobuf_path: {protobuf_path} must define exactly one service "
                         f"(it defines {len(services)})")
    [described] = services
    servicer = getattr(stubs, f"{described.name}Servicer")
    add_to_server = getattr(stubs, f"add_{described.name}Servicer_to_server")
    return Service(full_name=described.full_name, methods=tuple(m.name for m in described.methods),
                   servicer=servicer, add_to_server=add_to_server, messages=messages)


@dataclass(frozen=True)
class ProtoFacts:
    """What a .proto declares that the deploy checks."""

    package: str
    services: tuple[str, ...]   # full names: package.Service


def grpc_package(api_name: str) -> str:
    """The package an API's .proto must declare (Cortex's rule)."""
    return api_name.replace("-", "_")


def grpc_path_prefix(api_name: str) -> str:
    """What every RPC path of the API begins with: `/<package>.`."""
    return f"/{grpc_package(api_name)}."


def _protoc(source: Path, protobuf_path: str, out_args: list[str]) -> None:
    """Run grpcio-tools' protoc on `source` with `out_args`; a ProtoError with protoc's words if it fails."""
    with needs_extra("grpc", "gRPC realtime APIs"):
        import grpc_tools
    includes = Path(grpc_tools.__file__).resolve().parent / "_proto"
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{source.parent}", f"-I{includes}", *out_args, source.name],
        capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().replace(str(source.parent) + "/", "")
        raise ProtoError(f"predictor.protobuf_path: {protobuf_path} does not compile: {said}")


def _source(project_dir: Path, protobuf_path: str) -> Path:
    source = (project_dir / protobuf_path).resolve()
    if not source.is_file():
        raise ProtoError(f"predictor.protobuf_path: {protobuf_path} is not in the project folder")
    return source


def describe_proto(project_dir: Path, protobuf_path: str, work_dir: Path) -> ProtoFacts:
    """The package and services the project's .proto declares (compiled to a descriptor set in
    `work_dir`, nothing imported)."""
    from google.protobuf import descriptor_pb2

    source = _source(project_dir, protobuf_path)
    out = work_dir / "descriptor.pb"
    _protoc(source, protobuf_path, [f"--descriptor_set_out={out}"])
    described = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    [file] = described.file
    return ProtoFacts(package=file.package,
                      services=tuple(f"{file.package}.{s.name}" if file.package else s.name for s in file.service))


def check_proto(facts: ProtoFacts, api_name: str, protobuf_path: str) -> None:
    """Cortex's rules for a gRPC API's .proto: one service, in the package named after the API."""
    if len(facts.services) != 1:
        raise ProtoError(f"predictor.protobuf_path: {protobuf_path} must define exactly one service "
                         f"(it defines {len(facts.services)})")
    wanted = grpc_package(api_name)
    if facts.package != wanted:
        found = f"package {facts.package}" if facts.package else "no package"
        raise ProtoError(f"predictor.protobuf_path: {protobuf_path} must declare `package {wanted};` (the API's name "
                         f"with - spelled _), as on Cortex (it declares {found})")


def is_grpc(spec: dict[str, Any]) -> bool:
    """Whether a stored API spec is a RealtimeAPI served over gRPC."""
    predictor = spec.get("predictor")
    return isinstance(predictor, dict) and bool(predictor.get("protobuf_path"))
