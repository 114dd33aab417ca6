"""cortex.yaml loading: what a user deploys, and the errors that tell them what to fix."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from foundation.errors import ConfigError
from predictors_runtime.config import (
    ApiConfig,
    load_api_configs,
    merge_config,
    parse_api_configs,
    parse_deployment,
)
from predictors_runtime.splitter_config import TrafficSplitterConfig

BATCH_API = """
- name: iris-batch
  kind: BatchAPI
  predictor:
    type: python
    path: predictor.py
    config: {threshold: 0.5}
    env: {KEY: value}
    python_path: .
    models:
      paths: [{name: iris, path: s3://bucket/models/iris/}]
      cache_size: 2
      disk_cache_size: 4
    processes_per_replica: 1
    threads_per_process: 2
  compute: {cpu: 1, gpu: 0, inf: 0, mem: 2G}
"""


def parse(text: str) -> list[ApiConfig]:
    return parse_api_configs(textwrap.dedent(text))


def error_of(text: str, source: str = "cortex.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_api_configs(textwrap.dedent(text), source=source)
    return info.value.message


def api(predictor: str = "{path: predictor.py}", extra: str = "", name: str = "iris") -> str:
    """One API whose predictor section and extra top-level lines a test chooses."""
    return f"- name: {name}\n  kind: BatchAPI\n  predictor: {predictor}\n{extra}"


def test_a_valid_batch_api_with_a_predictor_section_is_read_in_full() -> None:
    [cfg] = parse(BATCH_API)
    assert cfg.name == "iris-batch"
    assert cfg.kind == "BatchAPI"
    assert cfg.predictor.type == "python"
    assert cfg.predictor.path == "predictor.py"
    assert cfg.predictor.config == {"threshold": 0.5}
    assert cfg.predictor.env == {"KEY": "value"}
    assert cfg.predictor.python_path == "."
    assert cfg.predictor.models is not None
    assert cfg.predictor.models.paths is not None
    assert cfg.predictor.models.paths[0].name == "iris"
    assert cfg.predictor.models.cache_size == 2
    assert cfg.predictor.threads_per_process == 2
    assert cfg.compute.mem == "2G"
    assert cfg.ignored_fields == []
    assert cfg.queue == "cpu"


def test_the_newer_handler_spelling_means_the_same_as_predictor() -> None:
    [by_predictor] = parse(BATCH_API)
    [by_handler] = parse(BATCH_API.replace("predictor:", "handler:"))
    assert by_handler == by_predictor


def test_multi_model_reloading_is_another_spelling_of_models_for_python() -> None:
    [cfg] = parse(api("{path: p.py, multi_model_reloading: {dir: s3://b/models/}}"))
    assert cfg.predictor.models is not None
    assert cfg.predictor.models.dir == "s3://b/models/"


def test_multi_model_reloading_is_refused_for_other_types() -> None:
    text = api("{type: onnx, path: p.py, multi_model_reloading: {dir: m}}")
    assert "API #0 (iris): predictor.multi_model_reloading: only valid for type python" in error_of(
        text
    )


def test_defaults_fill_in_what_a_minimal_api_leaves_out() -> None:
    [cfg] = parse(api())
    assert cfg.predictor.type == "python"
    assert cfg.predictor.config == {}
    assert cfg.predictor.env == {}
    assert cfg.predictor.processes_per_replica == 1
    assert cfg.predictor.log_level == "info"
    assert cfg.compute.cpu == "200m"  # Cortex's default: a small host holds several replicas
    assert (cfg.compute.gpu, cfg.compute.inf, cfg.compute.mem) == (0, 0, None)


def test_a_single_mapping_is_read_as_a_list_of_one_api() -> None:
    [cfg] = parse("name: solo\nkind: RealtimeAPI\npredictor: {path: p.py}\n")
    assert cfg.name == "solo"
    assert cfg.kind == "RealtimeAPI"


def test_load_api_configs_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "cortex.yaml"
    path.write_text(BATCH_API)
    assert [c.name for c in load_api_configs(path)] == ["iris-batch"]
    path.write_text(api(name="Bad"))
    with pytest.raises(ConfigError, match=rf"^{path}: API #0 \(Bad\): name: "):
        load_api_configs(path)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_api_configs(tmp_path / "cortex.yaml")


def test_an_empty_file_is_an_error() -> None:
    assert error_of("") == "cortex.yaml: the file is empty, expected a list of APIs"
    assert "empty" in error_of("# only a comment\n")


def test_a_yaml_syntax_error_is_wrapped_with_its_line_number() -> None:
    with pytest.raises(ConfigError) as info:
        parse_api_configs("- name: a\n  kind: [BatchAPI\n", source="x/cortex.yaml")
    assert info.value.message.startswith("x/cortex.yaml: line 3, column 1: invalid YAML")
    assert info.value.__cause__ is not None


def test_a_duplicated_key_is_an_error_rather_than_silently_overwritten() -> None:
    text = "- name: a\n  kind: BatchAPI\n  kind: RealtimeAPI\n  predictor: {path: p.py}\n"
    assert error_of(text) == "cortex.yaml: line 3, column 3: invalid YAML: duplicate key 'kind'"


def test_a_document_that_is_not_a_list_of_mappings_is_an_error() -> None:
    assert "expected a list of APIs (got str)" in error_of("just text")
    assert error_of("- 3\n") == "cortex.yaml: API #0: must be a mapping (got int)"


def test_a_missing_name_is_reported_by_api_index() -> None:
    text = api(name="ok") + "- kind: BatchAPI\n  predictor: {path: p.py}\n"
    assert error_of(text) == "cortex.yaml: API #1: name: field required"


@pytest.mark.parametrize(
    "name, reason",
    [
        ("Iris", "lowercase"),
        ("1iris", "start with a letter"),
        ("iris_batch", "lowercase letters, digits and '-'"),
        ("a" * 64, "at most 63 characters"),
        ("healthz", "reserved"),
        ("batch", "reserved"),
        ("apis", "reserved"),
        ("metrics", "reserved"),
    ],
)
def test_an_invalid_name_is_an_error_naming_the_name_field(name: str, reason: str) -> None:
    message = error_of(api(name=name))
    assert message.startswith(f"cortex.yaml: API #0 ({name}): name: ")
    assert reason in message


def test_a_name_of_63_characters_is_allowed() -> None:
    [cfg] = parse(api(name="a" * 63))
    assert len(cfg.name) == 63


def test_names_must_be_unique_within_the_file() -> None:
    message = error_of(api() + api())
    assert message == "cortex.yaml: API #1 (iris): name: duplicate name, already used by API #0"


def test_a_missing_kind_is_an_error() -> None:
    text = "- name: iris\n  predictor: {path: p.py}\n"
    assert error_of(text) == "cortex.yaml: API #0 (iris): kind: field required"


def test_an_unsupported_kind_is_an_error_listing_the_supported_kinds() -> None:
    text = api().replace("BatchAPI", "TrafficSpliter")
    assert error_of(text) == (
        "cortex.yaml: API #0 (iris): kind: unsupported kind 'TrafficSpliter' "
        "(supported kinds: BatchAPI, RealtimeAPI, TaskAPI, AsyncAPI, TrafficSplitter)"
    )


# -- gRPC ------------------------------------------------------------------------------------------
def test_a_grpc_realtime_api_names_its_proto_inside_the_project() -> None:
    realtime = api(predictor="{path: handler.py, protobuf_path: protos/iris.proto}").replace("BatchAPI", "RealtimeAPI")
    [config] = parse(realtime)
    assert config.predictor.protobuf_path == "protos/iris.proto"
    assert error_of(realtime.replace("protos/iris.proto", "../iris.proto")).endswith(
        "predictor.protobuf_path: must not leave the project folder (got '../iris.proto')")
    assert error_of(realtime.replace("protos/iris.proto", "iris.txt")).endswith(
        "predictor.protobuf_path: must be a .proto file (got 'iris.txt')")


def test_only_a_realtime_api_without_server_side_batching_is_served_over_grpc() -> None:
    batch = api(predictor="{path: handler.py, protobuf_path: iris.proto}")
    assert error_of(batch).endswith(
        "predictor.protobuf_path: only a RealtimeAPI is served over gRPC (kind is BatchAPI)")
    batched = api(predictor="{path: handler.py, protobuf_path: iris.proto, threads_per_process: 4, "
                  "server_side_batching: {max_batch_size: 4, batch_interval: 0.1}}").replace("BatchAPI", "RealtimeAPI")
    assert error_of(batched).endswith("predictor.server_side_batching: cannot be used with protobuf_path (a gRPC API "
                                      "runs each call on its own)")


# -- TrafficSplitter ---------------------------------------------------------------------------------
SPLITTER = """\
- name: iris
  kind: TrafficSplitter
  networking: {endpoint: /iris}
  apis:
    - {name: iris-onnx, weight: 30}
    - {name: iris-tf, weight: 70}
    - {name: recorder, weight: 100, shadow: true}
"""


def test_cortexs_traffic_splitter_is_read_with_its_weights_and_shadow() -> None:
    deployment = parse_deployment(api(name="iris-onnx").replace("BatchAPI", "RealtimeAPI") + SPLITTER)
    [splitter] = deployment.splitters
    assert [a.name for a in deployment.apis] == ["iris-onnx"]
    assert [(t.name, t.weight) for t in splitter.shared] == [("iris-onnx", 30), ("iris-tf", 70)]
    assert splitter.shadow is not None and (splitter.shadow.name, splitter.shadow.weight) == ("recorder", 100)
    assert splitter.ignored_fields == ["networking"]
    assert TrafficSplitterConfig.from_dict(splitter.to_dict()) == splitter


@pytest.mark.parametrize(("apis", "problem"), [
    ("[{name: a, weight: 30}, {name: b, weight: 60}]",
     "apis: the weights of the apis that are not the shadow must add up to 100 (they add up to 90)"),
    ("[{name: a, weight: 100}, {name: b, weight: 10, shadow: true}, {name: c, weight: 10, shadow: true}]",
     "apis: at most one api may be the shadow (shadow: b, c)"),
    ("[{name: a, weight: 50}, {name: a, weight: 50}]", "apis: each api may be named once (named more than once: a)"),
    ("[{name: iris, weight: 100}]", "apis: a TrafficSplitter cannot share requests with itself (iris)"),
    ("[{name: a, weight: 30.5}, {name: b, weight: 69.5}]", "apis[0].weight: must be a whole number from 0 to 100 "
     "(got 30.5)"),
    ("[{name: a, weight: 100, shadw: true}]", "apis[0].shadw: unknown field (did you mean shadow?)"),
    ("[{name: a}]", "apis[0].weight: field required"),
    ("[{name: A_b, weight: 100}]", "apis[0].name: must contain only lowercase letters"),
    ("[]", "apis: list should have at least 1 item"),
])
def test_a_splitter_whose_weights_cannot_work_is_refused_naming_the_field(apis: str, problem: str) -> None:
    message = error_of(f"- name: iris\n  kind: TrafficSplitter\n  apis: {apis}\n")
    assert message.startswith(f"cortex.yaml: API #0 (iris): {problem}"), message


def test_a_splitter_with_code_is_refused_saying_it_has_none() -> None:
    message = error_of(SPLITTER + "  predictor: {path: p.py}\n")
    assert message.startswith("cortex.yaml: API #0 (iris): predictor: unknown field (a TrafficSplitter has no code")


def test_reading_only_the_apis_with_code_refuses_a_splitter_by_name() -> None:
    with pytest.raises(ConfigError, match="iris is a TrafficSplitter: deploy it with sluice deploy"):
        parse_api_configs(SPLITTER)


def test_an_api_without_predictor_or_handler_is_an_error() -> None:
    text = "- name: iris\n  kind: BatchAPI\n"
    assert error_of(text) == (
        "cortex.yaml: API #0 (iris): predictor: field required (spelled predictor or handler)"
    )


def test_an_api_with_both_predictor_and_handler_is_an_error() -> None:
    text = api(extra="  handler: {path: p.py}\n")
    assert error_of(text) == (
        "cortex.yaml: API #0 (iris): handler: give either predictor or handler, not both"
    )


def test_predictor_path_is_required() -> None:
    message = error_of(api("{type: python}"))
    assert message == "cortex.yaml: API #0 (iris): predictor.path: field required"


@pytest.mark.parametrize(
    "path, reason",
    [
        ("predictor.txt", "must be a .py file"),
        ("/abs/predictor.py", "must be relative"),
        ("../predictor.py", "must not leave the project folder"),
        ("src/../../predictor.py", "must not leave the project folder"),
    ],
)
def test_a_bad_predictor_path_is_an_error_naming_the_field(path: str, reason: str) -> None:
    message = error_of(api(f"{{path: '{path}'}}"))
    assert message.startswith("cortex.yaml: API #0 (iris): predictor.path: ")
    assert reason in message


def test_errors_in_a_handler_section_use_the_handler_spelling() -> None:
    message = error_of(api("{path: p.txt}").replace("predictor:", "handler:"))
    assert message.startswith("cortex.yaml: API #0 (iris): handler.path: must be a .py file")


def test_a_misspelled_field_is_named_with_the_field_it_is_closest_to_at_its_own_level() -> None:
    assert error_of(api(extra="  predicter: {path: p.py}\n")) == (
        "cortex.yaml: API #0 (iris): predicter: unknown field (did you mean predictor?)"
    )
    assert error_of(api("{path: p.py, procesess_per_replica: 2}")) == (
        "cortex.yaml: API #0 (iris): predictor.procesess_per_replica: unknown field"
        " (did you mean processes_per_replica?)"
    )
    assert error_of(api("{path: p.py, models: {path: m, signature_kye: a}}")) == (
        "cortex.yaml: API #0 (iris): predictor.models.signature_kye: unknown field (did you mean signature_key?)"
    )


def test_an_unknown_field_is_an_error_naming_its_path() -> None:
    assert (
        error_of(api(extra="  colour: blue\n"))
        == "cortex.yaml: API #0 (iris): colour: unknown field"
    )
    assert error_of(api("{path: p.py, pth: x}")) == (
        "cortex.yaml: API #0 (iris): predictor.pth: unknown field (did you mean path?)"
    )
    assert error_of(api(extra="  compute: {cpu: 1, shm_size: 1G}\n")) == (
        "cortex.yaml: API #0 (iris): compute.shm_size: unknown field"
    )
    assert error_of(api("{path: p.py, models: {path: m, size: 3}}")) == (
        "cortex.yaml: API #0 (iris): predictor.models.size: unknown field"
    )


def test_ignored_fields_can_not_be_set_by_the_user() -> None:
    message = error_of(api(extra="  ignored_fields: []\n"))
    assert message == "cortex.yaml: API #0 (iris): ignored_fields: unknown field"


def test_cortex_fields_without_meaning_here_are_accepted_and_listed_as_ignored() -> None:
    text = api(
        "{path: p.py, image: 'quay.io/x', tensorflow_serving_image: y, shm_size: 1G}",
        extra="  autoscaling: {min_replicas: 1}\n  networking: {endpoint: /x}\n"
        "  update_strategy: {max_surge: 1}\n  monitoring: {model_type: classification}\n",
    )
    [cfg] = parse(text)
    assert sorted(cfg.ignored_fields) == [
        "autoscaling",
        "monitoring",
        "networking",
        "predictor.image",
        "predictor.shm_size",
        "predictor.tensorflow_serving_image",
        "update_strategy",
    ]


def test_dependency_files_are_read_where_predictor_dependencies_says() -> None:
    [cfg] = parse(api("{path: p.py, dependencies: {pip: deps/requirements.txt, shell: setup/install.sh}}"))
    assert cfg.ignored_fields == []
    assert cfg.predictor.dependencies is not None
    assert (cfg.predictor.dependencies.pip, cfg.predictor.dependencies.shell) == ("deps/requirements.txt",
                                                                                   "setup/install.sh")
    assert cfg.predictor.dependencies.conda == "conda-packages.txt"


def test_a_dependency_file_outside_the_project_is_refused() -> None:
    message = error_of(api("{path: p.py, dependencies: {pip: ../requirements.txt}}"))
    assert "predictor.dependencies.pip" in message and "must not leave the project folder" in message


def test_models_need_exactly_one_of_path_paths_or_dir() -> None:
    assert error_of(api("{path: p.py, models: {cache_size: 1}}")) == (
        "cortex.yaml: API #0 (iris): predictor.models: "
        "exactly one of path, paths or dir is required (found: none)"
    )
    assert "(found: path, dir)" in error_of(api("{path: p.py, models: {path: a, dir: b}}"))


def test_models_errors_use_the_multi_model_reloading_spelling_when_given() -> None:
    message = error_of(api("{path: p.py, multi_model_reloading: {}}"))
    assert message.startswith(
        "cortex.yaml: API #0 (iris): predictor.multi_model_reloading: exactly one"
    )


def test_the_disk_cache_must_hold_at_least_what_memory_holds() -> None:
    message = error_of(api("{path: p.py, models: {dir: d, cache_size: 3, disk_cache_size: 2}}"))
    assert message == (
        "cortex.yaml: API #0 (iris): predictor.models.disk_cache_size: "
        "must be >= cache_size (2 < 3)"
    )


def test_cache_sizes_must_be_at_least_one() -> None:
    message = error_of(api("{path: p.py, models: {dir: d, cache_size: 0}}"))
    assert message.startswith("cortex.yaml: API #0 (iris): predictor.models.cache_size: ")
    assert "greater than or equal to 1" in message


def test_model_names_in_paths_must_be_unique() -> None:
    text = api("{path: p.py, models: {paths: [{name: a, path: x}, {name: a, path: y}]}}")
    assert error_of(text) == (
        "cortex.yaml: API #0 (iris): predictor.models.paths[1].name: duplicate model name 'a'"
    )


def test_a_model_path_entry_needs_a_path() -> None:
    text = api("{path: p.py, models: {paths: [{name: a}]}}")
    assert (
        error_of(text)
        == "cortex.yaml: API #0 (iris): predictor.models.paths[0].path: field required"
    )


def test_signature_key_is_only_for_tensorflow() -> None:
    ok = api("{type: tensorflow, path: p.py, models: {path: m, signature_key: serving_default}}")
    [cfg] = parse(ok)
    assert cfg.predictor.models is not None
    assert cfg.predictor.models.signature_key == "serving_default"
    message = error_of(ok.replace("tensorflow", "onnx"))
    assert message == (
        "cortex.yaml: API #0 (iris): predictor.models.signature_key: "
        "only valid for type tensorflow (type is onnx)"
    )


def test_tensorflow_and_onnx_predictors_need_models() -> None:
    message = error_of(api("{type: onnx, path: p.py}"))
    assert message == "cortex.yaml: API #0 (iris): predictor.models: field required for type onnx"


def test_an_unknown_predictor_type_is_an_error() -> None:
    message = error_of(api("{type: pytorch, path: p.py}"))
    assert message.startswith("cortex.yaml: API #0 (iris): predictor.type: ")
    assert "'python', 'tensorflow' or 'onnx'" in message


def test_processes_and_threads_must_be_at_least_one() -> None:
    message = error_of(api("{path: p.py, processes_per_replica: 0, threads_per_process: 0}"))
    assert "predictor.processes_per_replica: input should be greater than or equal to 1" in message
    assert "; cortex.yaml: API #0 (iris): predictor.threads_per_process: " in message


def test_env_values_written_as_numbers_or_booleans_become_strings() -> None:
    [cfg] = parse(api("{path: p.py, env: {PORT: 8080, DEBUG: true}}"))
    assert cfg.predictor.env == {"PORT": "8080", "DEBUG": "true"}


def test_predictor_config_must_hold_only_json_values() -> None:
    message = error_of(api("{path: p.py, config: {when: 2024-01-01}}"))
    assert (
        message
        == "cortex.yaml: API #0 (iris): predictor.config.when: must be a JSON value (got date)"
    )


def test_cpu_accepts_numbers_and_millicpu_strings_but_not_zero() -> None:
    [cfg] = parse(api(extra="  compute: {cpu: 200m}\n"))
    assert cfg.compute.cpu == "200m"
    [cfg] = parse(api(extra="  compute: {cpu: 0.5}\n"))
    assert cfg.compute.cpu == 0.5
    for bad in ("0", "0m", "-1", "lots"):
        message = error_of(api(extra=f"  compute: {{cpu: '{bad}'}}\n"))
        assert message.startswith("cortex.yaml: API #0 (iris): compute.cpu: "), bad


def test_gpu_and_inf_must_not_be_negative() -> None:
    message = error_of(api(extra="  compute: {gpu: -1, inf: -2}\n"))
    assert "compute.gpu: input should be greater than or equal to 0" in message
    assert "compute.inf: input should be greater than or equal to 0" in message


@pytest.mark.parametrize(
    "compute, queue",
    [("{cpu: 2}", "cpu"), ("{gpu: 1}", "gpu"), ("{inf: 1}", "inf"), ("{gpu: 1, inf: 1}", "gpu")],
)
def test_the_queue_follows_the_hardware_asked_for(compute: str, queue: str) -> None:
    [cfg] = parse(api(extra=f"  compute: {compute}\n"))
    assert cfg.queue == queue


def test_every_problem_in_the_file_is_reported_at_once() -> None:
    text = api(name="Bad") + "- name: ok\n  kind: Nope\n  predictor: {path: p.py}\n"
    message = error_of(text)
    parts = message.split("; ")
    assert parts[0].startswith("cortex.yaml: API #0 (Bad): name: ")
    assert parts[1].startswith("cortex.yaml: API #1 (ok): kind: unsupported kind 'Nope'")


def test_a_config_round_trips_through_to_dict_and_json() -> None:
    [cfg] = parse(BATCH_API.replace("cpu: 1", "cpu: 200m") + "  autoscaling: {}\n")
    stored = json.loads(json.dumps(cfg.to_dict()))
    assert ApiConfig.from_dict(stored) == cfg
    assert stored["ignored_fields"] == ["autoscaling"]
    assert stored["predictor"]["models"]["paths"] == [
        {"name": "iris", "path": "s3://bucket/models/iris/"}
    ]


def test_from_dict_refuses_a_broken_record_with_a_config_error() -> None:
    [cfg] = parse(BATCH_API)
    stored = cfg.to_dict()
    stored["predictor"]["threads_per_process"] = 0
    with pytest.raises(ConfigError, match=r"\(iris-batch\): predictor.threads_per_process"):
        ApiConfig.from_dict(stored)


def test_a_parsed_config_can_not_be_changed_in_place() -> None:
    [cfg] = parse(BATCH_API)
    with pytest.raises(ValidationError):
        cfg.name = "other"


def test_merge_config_merges_nested_mappings_and_the_override_wins() -> None:
    base = {"threshold": 0.5, "model": {"name": "iris", "opts": {"a": 1, "b": 2}}, "tags": [1, 2]}
    override = {"model": {"opts": {"b": 3}}, "tags": [9], "new": True}
    merged = merge_config(base, override)
    assert merged == {
        "threshold": 0.5,
        "model": {"name": "iris", "opts": {"a": 1, "b": 3}},
        "tags": [9],
        "new": True,
    }


def test_merge_config_does_not_touch_its_inputs() -> None:
    base = {"model": {"opts": {"a": 1}}, "tags": [1]}
    override = {"model": {"opts": {"b": 2}}, "extra": {"x": [1]}}
    merged = merge_config(base, override)
    merged["model"]["opts"]["a"] = 99
    merged["extra"]["x"].append(2)
    merged["tags"].append(3)
    assert base == {"model": {"opts": {"a": 1}}, "tags": [1]}
    assert override == {"model": {"opts": {"b": 2}}, "extra": {"x": [1]}}


def test_merge_config_lets_a_plain_value_replace_a_mapping_and_back() -> None:
    assert merge_config({"a": {"b": 1}}, {"a": 2}) == {"a": 2}
    assert merge_config({"a": 2}, {"a": {"b": 1}}) == {"a": {"b": 1}}


def test_realtime_fields_are_read_with_cortex_durations_and_defaults() -> None:
    [cfg] = parse(
        "name: rt\nkind: RealtimeAPI\npredictor: {path: p.py, threads_per_process: 8, "
        "server_side_batching: {max_batch_size: 8, batch_interval: 100ms}, request_timeout: 2.5}\n"
    )
    predictor = cfg.predictor
    assert predictor.server_side_batching is not None
    assert predictor.server_side_batching.max_batch_size == 8
    assert predictor.server_side_batching.batch_interval == pytest.approx(0.1)
    assert predictor.request_timeout == 2.5
    assert predictor.max_queue_length is None and cfg.replica_queue_length == 100  # not written: the default
    assert predictor.replica_concurrency == 8  # processes x threads when max_concurrency is unset


def test_a_batch_larger_than_the_thread_pool_is_refused() -> None:
    message = error_of(api("{path: p.py, server_side_batching: {max_batch_size: 8, batch_interval: 0.1}}"))
    assert message == (
        "cortex.yaml: API #0 (iris): predictor.server_side_batching.max_batch_size: "
        "must be <= threads_per_process (8 > 1)"
    )


@pytest.mark.parametrize("field, value", [
    ("max_concurrency", "0"), ("max_concurrency", "100001"), ("max_queue_length", "-1"),
    ("request_timeout", "0"), ("request_timeout", "1e300"), ("processes_per_replica", "65"),
])
def test_realtime_numbers_out_of_range_name_the_field(field: str, value: str) -> None:
    message = error_of(api(f"{{path: p.py, {field}: {value}}}"))
    assert f"predictor.{field}:" in message
