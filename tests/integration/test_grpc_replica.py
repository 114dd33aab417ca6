"""A gRPC replica process serving Cortex-shaped gRPC projects (Cortex v0.32-v0.35's
`predictor.protobuf_path`), called as Cortex's gRPC client examples call an API: stubs compiled
from the project's own .proto with grpcio-tools, a unary RPC and a server-streaming one.

The replica (`sluice/grpc_replica.py`) is started as its launcher would start it, from the
`SLUICE_REPLICA_*` variables; nothing here reaches a network beyond loopback.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import pytest

from foundation.api_registry import DeployedApi
from foundation.replica_directory import ReadinessMarkers
from predictors_runtime.builder import build_predictor
from predictors_runtime.config import ApiConfig, parse_api_configs
from sluice.embedded import free_port
from testbed.waiting import wait_for
from tests.unit.test_cortex_interfaces import predictor_source, row_id, write

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60

IRIS_PROTO = """
syntax = "proto3";

package iris_classifier;

service Handler {
    rpc Predict (Sample) returns (Response);
    rpc Explain (Sample) returns (Response);
    rpc Count (Upto) returns (stream Number);
}

message Sample {
    float sepal_length = 1;
    float sepal_width = 2;
    float petal_length = 3;
    float petal_width = 4;
}

message Response {
    string classification = 1;
}

message Upto {
    int64 n = 1;
}

message Number {
    int64 value = 1;
}
"""

# A Cortex gRPC handler: the messages module offered to __init__, one method per RPC, payload and
# context taken as declared, a streaming RPC's method yielding its messages.
IRIS_HANDLER = """
import iris_classifier_pb2


class Handler:
    def __init__(self, config, proto_module_pb2):
        self.labels = config["labels"]
        self.proto_module_pb2 = proto_module_pb2
        assert proto_module_pb2 is iris_classifier_pb2  # the same module the handler may import itself

    def Predict(self, payload):
        label = 0 if payload.petal_length < 2.5 else 1 if payload.petal_width < 1.75 else 2
        print("classified", label)  # a printed line is a log line, as on Cortex
        return self.proto_module_pb2.Response(classification=self.labels[label])

    def Explain(self, payload, context):
        raise ValueError(f"cannot explain a sample of petal length {payload.petal_length:g}")

    def Count(self, payload):
        for value in range(1, payload.n + 1):
            if value == 13:
                raise RuntimeError("13 is unlucky")
            yield self.proto_module_pb2.Number(value=value)
"""


def stubs_of(proto: Path, out: Path) -> tuple[ModuleType, ModuleType]:
    """What a Cortex user ran on their side: `python -m grpc_tools.protoc ... iris_classifier.proto`."""
    out.mkdir()
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}", f"--python_out={out}",
                    f"--grpc_python_out={out}", proto.name], check=True)
    sys.path.insert(0, str(out))
    try:
        return importlib.import_module(f"{proto.stem}_pb2"), importlib.import_module(f"{proto.stem}_pb2_grpc")
    finally:
        sys.path.remove(str(out))


class GrpcReplica:
    """The replica as its launcher starts it, on the session's Redis (its log lines and figures go
    there: never to whatever listens at the default address)."""

    def __init__(self, tmp_path: Path, project: Path, spec: dict, redis_url: str) -> None:
        api = ApiConfig.from_dict(spec)
        deployed = DeployedApi.of(api, "b1")
        spec_path = tmp_path / "spec.json"
        spec_path.write_text(json.dumps(deployed.to_dict()))
        self.state = tmp_path / "state"
        self.port = free_port()
        self.log = tmp_path / "replica.log"
        env = {**os.environ, "SLUICE_REPLICA_SPEC": str(spec_path), "SLUICE_REPLICA_PROJECT": str(project),
               "SLUICE_REPLICA_STATE_DIR": str(self.state), "SLUICE_REPLICA_ID": "iris-grpc-1",
               "SLUICE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT), "SLUICE_REDIS_URL": redis_url}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sluice.grpc_replica", f"127.0.0.1:{self.port}"],
                cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")

    def lines(self) -> list[dict]:
        found = []
        for raw in self.log.read_text().splitlines():
            try:
                found.append(json.loads(raw))
            except ValueError:
                continue
        return found

    def stop(self) -> int:
        self.channel.close()
        self.process.terminate()
        return self.process.wait(WAIT_S)


@pytest.fixture
def iris(tmp_path: Path, redis_server: str) -> Iterator[tuple[GrpcReplica, ModuleType, ModuleType]]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "iris_classifier.proto").write_text(IRIS_PROTO)
    (project / "handler.py").write_text(IRIS_HANDLER)
    replica = GrpcReplica(tmp_path, project, {
        "name": "iris-classifier", "kind": "RealtimeAPI",
        "predictor": {"path": "handler.py", "protobuf_path": "iris_classifier.proto", "threads_per_process": 4,
                      "config": {"labels": ["setosa", "versicolor", "virginica"]}}}, redis_server)
    messages, stubs = stubs_of(project / "iris_classifier.proto", tmp_path / "client")
    try:
        wait_for(lambda: ReadinessMarkers(replica.state).ready_count() == 1 or replica.process.poll() is not None,
                 WAIT_S, "the gRPC replica to build its predictor")
        assert replica.process.poll() is None, replica.log.read_text()
        yield replica, messages, stubs
    finally:
        assert replica.stop() == 0, replica.log.read_text()


def test_a_cortex_grpc_handler_answers_its_rpc_with_the_projects_own_messages(iris):
    replica, messages, stubs = iris
    stub = stubs.HandlerStub(replica.channel)
    sample = messages.Sample(sepal_length=5.2, sepal_width=3.6, petal_length=1.4, petal_width=0.3)
    answer, call = stub.Predict.with_call(sample, metadata=(("x-request-id", "grpc-1"),), timeout=WAIT_S)
    assert answer.classification == "setosa"
    assert dict(call.trailing_metadata())["x-request-id"] == "grpc-1"
    wide = messages.Sample(sepal_length=6.9, sepal_width=3.1, petal_length=5.4, petal_width=2.1)
    assert stub.Predict(wide, timeout=WAIT_S).classification == "virginica"
    printed = wait_for(lambda: [line for line in replica.lines() if line.get("message") == "classified 0"], WAIT_S,
                       "the handler's printed line in the replica's log")
    assert printed[0]["labels"]["api"] == "iris-classifier" and printed[0]["labels"]["request_id"] == "grpc-1"


def test_a_server_streaming_rpc_yields_its_messages_and_a_raise_midway_ends_it_internal(iris):
    replica, messages, stubs = iris
    stub = stubs.HandlerStub(replica.channel)
    assert [number.value for number in stub.Count(messages.Upto(n=5), timeout=WAIT_S)] == [1, 2, 3, 4, 5]
    received: list[int] = []
    with pytest.raises(grpc.RpcError) as ended:
        received.extend(number.value for number in stub.Count(messages.Upto(n=20), timeout=WAIT_S))
    assert received == list(range(1, 13))
    assert ended.value.code() == grpc.StatusCode.INTERNAL
    assert ended.value.details() == "predictor_error: RuntimeError: 13 is unlucky"


def test_a_raising_handler_ends_the_call_internal_naming_the_error_and_the_replica_keeps_serving(iris):
    replica, messages, stubs = iris
    stub = stubs.HandlerStub(replica.channel)
    with pytest.raises(grpc.RpcError) as failed:
        stub.Explain(messages.Sample(petal_length=4.5), timeout=WAIT_S)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert failed.value.details() == "predictor_error: ValueError: cannot explain a sample of petal length 4.5"
    assert stub.Predict(messages.Sample(petal_length=4.5, petal_width=1.5), timeout=WAIT_S).classification == \
        "versicolor"
    logged = [line for line in replica.lines() if line.get("message", "").startswith("predictor raised ValueError")]
    assert logged and "Traceback" in logged[0]["exception"] and "Explain" in logged[0]["exception"]


def test_a_proto_that_does_not_compile_fails_the_replica_naming_the_line_and_every_call_says_so(
        tmp_path, redis_server):
    project = tmp_path / "project"
    project.mkdir()
    (project / "broken.proto").write_text('syntax = "proto3";\npackage broken;\nmessage A { strin a = 1; }\n')
    (project / "handler.py").write_text("class Handler:\n    pass\n")
    replica = GrpcReplica(tmp_path, project, {"name": "broken", "kind": "RealtimeAPI", "predictor": {
        "path": "handler.py", "protobuf_path": "broken.proto"}}, redis_server)
    try:
        failure = wait_for(lambda: ReadinessMarkers(replica.state).failure(), WAIT_S, "the replica to fail")
        assert failure.startswith("predictor.protobuf_path: broken.proto does not compile: broken.proto:3"), failure
        assert "strin" in failure and str(project) not in failure
        with pytest.raises(grpc.RpcError) as refused:
            replica.channel.unary_unary("/broken.Anything/Call")(b"", timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details() == f"building the predictor failed: {failure}"
    finally:
        assert replica.stop() == 0


def test_a_handler_that_fails_to_build_makes_every_call_unavailable_saying_why(tmp_path, redis_server):
    project = tmp_path / "project"
    project.mkdir()
    (project / "iris_classifier.proto").write_text(IRIS_PROTO)
    (project / "handler.py").write_text(IRIS_HANDLER.replace('config["labels"]', 'config["no-such-key"]'))
    replica = GrpcReplica(tmp_path, project, {"name": "iris-classifier", "kind": "RealtimeAPI", "predictor": {
        "path": "handler.py", "protobuf_path": "iris_classifier.proto"}}, redis_server)
    messages, stubs = stubs_of(project / "iris_classifier.proto", tmp_path / "client")
    try:
        wait_for(lambda: ReadinessMarkers(replica.state).failure(), WAIT_S, "the build to fail")
        with pytest.raises(grpc.RpcError) as refused:
            stubs.HandlerStub(replica.channel).Predict(messages.Sample(), timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert refused.value.details().startswith("building the predictor failed: ")
        assert "no-such-key" in refused.value.details()
    finally:
        assert replica.stop() == 0


# -- every gRPC interface Cortex documented ------------------------------------------------------
# gRPC realtime APIs (v0.32 onwards): Cortex's server passed `proto_module_pb2`; the v0.34-v0.35 interface page
# spelled it `module_proto_pb2`. Each RPC's method takes what it declares of `payload` and `context`.
GRPC = [
    ("v0.32-v0.35", "PythonPredictor", "config, proto_module_pb2", {"Predict": "payload"}),
    ("v0.32-v0.35", "PythonPredictor", "config, proto_module_pb2", {"Predict": "payload, context"}),
    ("v0.34-v0.35", "Handler", "config, module_proto_pb2", {"Predict": "payload, context"}),
    ("v0.34-v0.35", "Handler", "config, proto_module_pb2", {"Predict": "payload"}),
]
ROWS_PROTO = """
syntax = "proto3";
package iris;
service Handler { rpc Predict (Sample) returns (Sample); }
message Sample { float x = 1; }
"""


class _Context:
    """What a gRPC method's `context` offers that the replica reads."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", "r-1"),)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailing = metadata


@pytest.mark.parametrize(("versions", "class_name", "init", "methods"), GRPC, ids=[row_id(r) for r in GRPC])
def test_a_grpc_interface_cortex_documented_gets_what_cortex_gave_it(
        tmp_path: Path, versions: str, class_name: str, init: str, methods: dict[str, str]) -> None:
    from predictors_runtime.grpc_proto import compile_proto, service_of
    from sluice.grpc_replica import PROTO_MODULE_ARGUMENTS, PredictorSlot, servicer_for

    folder = write(tmp_path / "project", predictor_source(class_name, init, methods))
    (folder / "rows_iris.proto").write_text(ROWS_PROTO)
    messages, stubs = compile_proto(folder, "rows_iris.proto", tmp_path / "generated")
    [config] = parse_api_configs("- name: iris\n  kind: RealtimeAPI\n  predictor: {path: predictor.py, "
                                 "protobuf_path: rows_iris.proto, config: {k: 1}}\n")
    built = build_predictor(folder, config, {"config": {"k": 1}, **dict.fromkeys(PROTO_MODULE_ARGUMENTS, messages)},
                            model_cache_dir=tmp_path / "m", poll_interval_s=10.0)
    slot = PredictorSlot()
    slot.instance = built.instance
    servicer = servicer_for(service_of(messages, stubs, "rows_iris.proto"), slot, "iris", None)
    request, context = messages.Sample(x=1.5), _Context()

    assert servicer.Predict(request, context) == "answered"
    given = {"config": {"k": 1}, "proto_module_pb2": messages, "module_proto_pb2": messages, "payload": request,
             "context": context}
    expected = [("__init__", {a.strip(): given[a.strip()] for a in init.split(",")})]
    expected += [(name, {a.strip(): given[a.strip()] for a in args.split(",")}) for name, args in methods.items()]
    assert built.instance.seen == expected
    assert context.trailing == (("x-request-id", "r-1"),)
    built.close()
