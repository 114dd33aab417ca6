"""Every constructor and method signature Cortex documented for a predictor or handler, each built and called
by Sluice as Cortex called it: one row per interface, with the Cortex versions that documented it.

The rows come from the Cortex pages in the project's reference documents (realtime predictors of v0.25-v0.33
and their latest pages, batch predictors, the `Handler` naming of v0.34-v0.35); the model clients'
spellings (`python_client`, `model_client`) are in tests/unit/test_builder.py, their outputs in
tests/unit/test_tensorflow_outputs.py, and the gRPC rows (which compile a .proto) in
tests/integration/test_grpc_replica.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from predictors_runtime.batch_predictor import BatchPredictor
from predictors_runtime.builder import build_predictor
from predictors_runtime.config import ApiConfig, parse_api_configs
from predictors_runtime.realtime_predictor import RealtimePredictor, RequestArgs


def predictor_source(class_name: str, init: str, methods: dict[str, str]) -> str:
    """A predictor class with `__init__(self, <init>)` and each method `name(self, <args>)`, recording its calls."""
    init_args = [a.strip() for a in init.split(",") if a.strip()]
    lines = [f"class {class_name}:", f"    def __init__(self, {init}):", "        self.seen = []",
             f"        self.seen.append(('__init__', {{{', '.join(f'{a!r}: {a}' for a in init_args)}}}))"]
    for name, args in methods.items():
        names = [a.strip() for a in args.split(",") if a.strip()]
        lines.append(f"    def {name}(self{', ' if names else ''}{args}):")
        lines.append(f"        self.seen.append(({name!r}, {{{', '.join(f'{a!r}: {a}' for a in names)}}}))")
        lines.append("        return 'answered'" if name != "on_job_complete" else "        return None")
    return "\n".join(lines) + "\n"


def api(kind: str) -> ApiConfig:
    text = f"- name: iris\n  kind: {kind}\n  predictor: {{path: predictor.py, config: {{k: 1}}}}\n"
    [config] = parse_api_configs(text)
    return config


def write(folder: Path, source: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(textwrap.dedent(source))
    return folder


REALTIME = [
    # (Cortex versions, class, __init__ arguments, method -> its arguments)
    ("v0.25-v0.33", "PythonPredictor", "config", {"predict": "payload"}),
    ("v0.25-v0.33", "PythonPredictor", "config", {"predict": "payload, query_params"}),
    ("v0.25-v0.33", "PythonPredictor", "config", {"predict": "payload, headers"}),
    ("v0.25-v0.33", "PythonPredictor", "config", {"predict": "payload, query_params, headers",
                                                  "post_predict": "response, payload, query_params, headers"}),
    ("v0.34-v0.35", "Handler", "config", {"handle_post": "payload, query_params, headers"}),
    ("v0.34-v0.35", "Handler", "config", {"handle_post": "payload"}),
]

BATCH = [
    ("v0.25-v0.33", "PythonPredictor", "config, job_spec", {"predict": "payload, batch_id", "on_job_complete": ""}),
    ("v0.25-v0.33", "PythonPredictor", "config", {"predict": "payload"}),
    ("v0.34-v0.35", "Handler", "config, job_spec", {"handle_batch": "payload, batch_id", "on_job_complete": ""}),
]


def row_id(row: tuple[str, str, str, dict[str, str]]) -> str:
    versions, class_name, init, methods = row
    return f"{versions}:{class_name}({init})." + "+".join(f"{m}({a})" for m, a in methods.items())


@pytest.mark.parametrize(("versions", "class_name", "init", "methods"), REALTIME, ids=[row_id(r) for r in REALTIME])
def test_a_realtime_interface_cortex_documented_gets_what_cortex_gave_it(
        tmp_path: Path, versions: str, class_name: str, init: str, methods: dict[str, str]) -> None:
    folder = write(tmp_path / "project", predictor_source(class_name, init, methods))
    built = build_predictor(folder, api("RealtimeAPI"), {"config": {"k": 1}}, model_cache_dir=tmp_path / "m",
                            poll_interval_s=10.0)
    predictor = RealtimePredictor(built.instance)

    answer = predictor.predict(RequestArgs(payload={"x": 1}, query_params={"q": "2"}, headers={"h": "3"}))
    if predictor.has_post_predict:
        predictor.post_predict(answer, RequestArgs(payload={"x": 1}, query_params={"q": "2"}, headers={"h": "3"}))

    given = {"config": {"k": 1}, "payload": {"x": 1}, "query_params": {"q": "2"}, "headers": {"h": "3"},
             "response": "answered"}
    expected = [("__init__", {a.strip(): given[a.strip()] for a in init.split(",")})]
    expected += [(name, {a.strip(): given[a.strip()] for a in args.split(",") if a.strip()})
                 for name, args in methods.items()]
    assert answer == "answered"
    assert [(name, {k: dict(v) if k == "headers" else v for k, v in args.items()})
            for name, args in built.instance.seen] == expected
    built.close()


@pytest.mark.parametrize(("versions", "class_name", "init", "methods"), BATCH, ids=[row_id(r) for r in BATCH])
def test_a_batch_interface_cortex_documented_gets_what_cortex_gave_it(
        tmp_path: Path, versions: str, class_name: str, init: str, methods: dict[str, str]) -> None:
    folder = write(tmp_path / "project", predictor_source(class_name, init, methods))
    job_spec = {"job_id": "j1", "api_name": "iris", "workers": 1, "total_batch_count": 1}
    predictor = BatchPredictor.build(folder, api("BatchAPI"), job_spec, {"k": 2}, model_cache_dir=tmp_path / "m")

    predictor.predict([1, 2], "b-0")
    if predictor.has_on_job_complete:
        predictor.on_job_complete({"status": "status_succeeded"})

    given: dict[str, Any] = {"config": {"k": 2}, "job_spec": job_spec, "payload": [1, 2], "batch_id": "b-0"}
    expected = [("__init__", {a.strip(): given[a.strip()] for a in init.split(",")})]
    expected += [(name, {a.strip(): given[a.strip()] for a in args.split(",") if a.strip()})
                 for name, args in methods.items()]
    assert predictor.instance.seen == expected
    predictor.close()

