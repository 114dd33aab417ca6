"""The `autoscaling` section: a Cortex file's figures read with Cortex's defaults, and refused
at deploy, naming the field, when they cannot work together."""

from __future__ import annotations

import json
import textwrap

import pytest

from foundation.errors import ConfigError
from predictors_runtime.autoscaling_config import AutoscalingConfig, format_duration, parse_duration
from predictors_runtime.config import ApiConfig, parse_api_configs


def api(autoscaling: str | None = None, kind: str = "RealtimeAPI", predictor: str = "{path: p.py}") -> str:
    """One API of the kind a test chooses, with the autoscaling section it writes (flow style)."""
    text = f"- name: iris\n  kind: {kind}\n  predictor: {predictor}\n"
    return text + (f"  autoscaling: {autoscaling}\n" if autoscaling is not None else "")


def scaling_of(text: str) -> AutoscalingConfig:
    [cfg] = parse_api_configs(textwrap.dedent(text))
    assert cfg.autoscaling is not None
    assert "autoscaling" not in cfg.ignored_fields
    return cfg.autoscaling


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_api_configs(textwrap.dedent(text))
    assert info.value.http_status == 400
    return info.value.message


def test_a_realtime_api_without_the_section_scales_with_cortexs_defaults() -> None:
    scaling = scaling_of(api(predictor="{path: p.py, processes_per_replica: 2, threads_per_process: 3}"))
    assert (scaling.min_replicas, scaling.max_replicas, scaling.init_replicas) == (1, 100, 1)
    assert scaling.target_replica_concurrency == 6  # processes x threads
    assert scaling.max_replica_concurrency is None  # not written: no limit beyond the predictor's own
    assert (scaling.window, scaling.downscale_stabilization_period, scaling.upscale_stabilization_period) == (
        60, 300, 60)
    assert (scaling.max_downscale_factor, scaling.max_upscale_factor) == (0.75, 1.5)
    assert (scaling.downscale_tolerance, scaling.upscale_tolerance) == (0.05, 0.05)


def test_a_bad_processes_figure_is_reported_once_on_its_own_field() -> None:
    message = error_of(api(predictor="{path: p.py, processes_per_replica: 1000000, threads_per_process: 8}"))
    assert message == ("cortex.yaml: API #0 (iris): predictor.processes_per_replica: "
                       "input should be less than or equal to 64 (got 1000000)")


def test_an_empty_section_means_the_defaults_too() -> None:
    assert scaling_of(api("")) == scaling_of(api())
    assert scaling_of(api("{}")) == scaling_of(api())


def test_an_async_api_reads_every_field_as_written_in_cortexs_units() -> None:
    scaling = scaling_of(api(
        "{min_replicas: 0, max_replicas: 8, init_replicas: 2, target_replica_concurrency: 2.5, "
        "max_replica_concurrency: 16, window: 2m, downscale_stabilization_period: 1h30m, "
        "upscale_stabilization_period: 30, max_downscale_factor: 0.5, max_upscale_factor: 3, "
        "downscale_tolerance: 0.1, upscale_tolerance: 0}",
        kind="AsyncAPI",
    ))
    assert (scaling.min_replicas, scaling.max_replicas, scaling.init_replicas) == (0, 8, 2)
    assert (scaling.target_replica_concurrency, scaling.max_replica_concurrency) == (2.5, 16)
    assert (scaling.window, scaling.downscale_stabilization_period, scaling.upscale_stabilization_period) == (
        120, 5400, 30)
    assert (scaling.max_downscale_factor, scaling.max_upscale_factor) == (0.5, 3)
    assert (scaling.downscale_tolerance, scaling.upscale_tolerance) == (0.1, 0)


def test_init_replicas_starts_at_min_replicas_unless_given() -> None:
    assert scaling_of(api("{min_replicas: 3}")).init_replicas == 3
    assert scaling_of(api("{min_replicas: 3, init_replicas: 5}")).init_replicas == 5


def test_cortex_v036s_target_in_flight_is_the_same_target() -> None:
    assert scaling_of(api("{target_in_flight: 4}")).target_replica_concurrency == 4
    assert scaling_of(api("{target_in_flight: 4}")) == scaling_of(api("{target_replica_concurrency: 4}"))


@pytest.mark.parametrize("written, seconds", [
    ("60s", 60), ("1m", 60), ("5m", 300), ("1h30m", 5400), ("1.5m", 90), ("500ms", 0.5), ("90", 90), (90, 90),
    (12.5, 12.5),
])
def test_durations_read_as_cortex_wrote_them_or_as_seconds(written: object, seconds: float) -> None:
    assert parse_duration(written) == seconds


def test_durations_are_shown_back_in_cortexs_spelling() -> None:
    assert [format_duration(s) for s in (45, 90, 5400, 0, 0.5)] == ["45s", "1m30s", "1h30m", "0s", "0.5s"]


def test_a_realtime_api_cannot_scale_to_zero_but_an_async_api_can() -> None:
    assert error_of(api("{min_replicas: 0}")) == (
        "cortex.yaml: API #0 (iris): autoscaling.min_replicas: "
        "must be at least 1 for a RealtimeAPI (only an AsyncAPI scales to zero)"
    )
    assert scaling_of(api("{min_replicas: 0}", kind="AsyncAPI")).min_replicas == 0


@pytest.mark.parametrize("section, field, message", [
    ("{min_replicas: 5, max_replicas: 2}", "min_replicas", "must be <= max_replicas (5 > 2)"),
    ("{min_replicas: 2, max_replicas: 5, init_replicas: 7}", "init_replicas",
     "must be between min_replicas and max_replicas (2 to 5, got 7)"),
    ("{min_replicas: 2, init_replicas: 1}", "init_replicas",
     "must be between min_replicas and max_replicas (2 to 100, got 1)"),
    ("{window: 45s}", "window", "must be a positive multiple of 10s (got 45s)"),
    ("{window: 0}", "window", "must be a positive multiple of 10s (got 0s)"),
    ("{window: 1x}", "window", "must be seconds or a duration such as '60s', '5m' or '1h30m' (got '1x')"),
    ("{max_downscale_factor: 1}", "max_downscale_factor", "input should be less than 1 (got 1)"),
    ("{max_downscale_factor: -0.5}", "max_downscale_factor",
     "input should be greater than or equal to 0 (got -0.5)"),
    ("{max_upscale_factor: 1}", "max_upscale_factor", "input should be greater than 1 (got 1)"),
    ("{downscale_tolerance: -0.1}", "downscale_tolerance", "input should be greater than or equal to 0 (got -0.1)"),
    ("{upscale_tolerance: -1}", "upscale_tolerance", "input should be greater than or equal to 0 (got -1)"),
    ("{min_replicas: -1}", "min_replicas", "input should be greater than or equal to 0 (got -1)"),
    ("{max_replicas: 0}", "max_replicas", "input should be greater than or equal to 1 (got 0)"),
    ("{target_replica_concurrency: 0}", "target_replica_concurrency", "input should be greater than 0 (got 0)"),
    ("{target_replica_concurrency: .nan}", "target_replica_concurrency", "input should be a finite number (got nan)"),
    ("{max_replica_concurrency: -3}", "max_replica_concurrency",
     "input should be greater than or equal to 1 (got -3)"),
    ("{upscale_stabilization_period: -5}", "upscale_stabilization_period",
     "input should be greater than or equal to 0 (got -5)"),
    ("{downscale_stabilization_period: '-5m'}", "downscale_stabilization_period",
     "must be seconds or a duration such as '60s', '5m' or '1h30m' (got '-5m')"),
    ("{target_in_flight: 1, target_replica_concurrency: 2}", "target_replica_concurrency",
     "give either target_replica_concurrency or target_in_flight (its newer name), not both"),
    ("{min_replica: 2}", "min_replica", "unknown field (did you mean min_replicas?)"),
])
def test_each_invalid_figure_is_refused_at_deploy_naming_its_field(section: str, field: str, message: str) -> None:
    assert error_of(api(section)) == f"cortex.yaml: API #0 (iris): autoscaling.{field}: {message}"


def test_every_problem_of_the_section_is_reported_at_once() -> None:
    problems = error_of(api("{window: 45s, max_upscale_factor: 0.5, colour: red, "
                            "target_in_flight: 1, target_replica_concurrency: 1}")).split("; ")
    assert [p.split(": ")[2] for p in problems] == [
        "autoscaling.target_replica_concurrency", "autoscaling.window", "autoscaling.max_upscale_factor",
        "autoscaling.colour",
    ]


def test_a_section_that_is_not_a_mapping_is_refused() -> None:
    assert error_of(api("3")).startswith("cortex.yaml: API #0 (iris): autoscaling: input should be a valid dictionary")


@pytest.mark.parametrize("kind, code", [("BatchAPI", "predictor"), ("TaskAPI", "definition")])
def test_batch_and_task_apis_still_accept_and_ignore_the_section(kind: str, code: str) -> None:
    text = f"- name: iris\n  kind: {kind}\n  {code}: {{path: p.py}}\n  autoscaling: {{min_replicas: nonsense}}\n"
    [cfg] = parse_api_configs(text)
    assert cfg.autoscaling is None
    assert cfg.ignored_fields == ["autoscaling"]


def test_the_section_is_stored_resolved_and_read_back_unchanged() -> None:
    [cfg] = parse_api_configs(api("{target_in_flight: 3, window: 1m, min_replicas: 2}"))
    stored = json.loads(json.dumps(cfg.to_dict()))
    assert stored["autoscaling"]["target_replica_concurrency"] == 3
    assert stored["autoscaling"]["init_replicas"] == 2
    assert stored["autoscaling"]["window"] == 60
    assert "target_in_flight" not in stored["autoscaling"]
    assert ApiConfig.from_dict(stored) == cfg


def test_a_realtime_api_stored_before_the_section_existed_reads_back_with_the_defaults() -> None:
    [cfg] = parse_api_configs(api(predictor="{path: p.py, threads_per_process: 4}"))
    stored = cfg.to_dict()
    del stored["autoscaling"]
    assert ApiConfig.from_dict(stored) == cfg


def test_a_stored_batch_api_with_a_section_is_refused() -> None:
    [cfg] = parse_api_configs(api(kind="BatchAPI"))
    stored = {**cfg.to_dict(), "autoscaling": {"min_replicas": 1, "target_replica_concurrency": 1}}
    with pytest.raises(ConfigError, match=r"autoscaling: only a RealtimeAPI or AsyncAPI has replicas to scale"):
        ApiConfig.from_dict(stored)


def test_a_target_above_max_replica_concurrency_is_refused_naming_both() -> None:
    message = error_of(api("{target_replica_concurrency: 8, max_replica_concurrency: 4}",
                           predictor="{path: p.py, threads_per_process: 4}"))
    assert message == ("cortex.yaml: API #0 (iris): autoscaling.target_replica_concurrency: "
                       "must be <= max_replica_concurrency (8 > 4)")


def test_max_replica_concurrency_below_what_one_replica_runs_at_once_is_refused() -> None:
    message = error_of(api("{target_replica_concurrency: 2, max_replica_concurrency: 2}",
                           predictor="{path: p.py, processes_per_replica: 2, threads_per_process: 2}"))
    assert message == ("cortex.yaml: API #0 (iris): autoscaling.max_replica_concurrency: must be >= the requests "
                       "one replica runs at once, predictor.processes_per_replica x threads_per_process (2 < 4)")


def test_a_max_queue_length_that_does_not_fit_in_max_replica_concurrency_is_refused_naming_both() -> None:
    message = error_of(api("{max_replica_concurrency: 5}",
                           predictor="{path: p.py, max_concurrency: 2, max_queue_length: 4}"))
    assert message == ("cortex.yaml: API #0 (iris): predictor.max_queue_length: conflicts with "
                       "autoscaling.max_replica_concurrency: predictor.max_concurrency plus max_queue_length must "
                       "be <= max_replica_concurrency (2 + 4 > 5)")


def test_a_written_max_replica_concurrency_is_stored_and_read_back_as_written() -> None:
    [cfg] = parse_api_configs(api("{max_replica_concurrency: 5}", predictor="{path: p.py, max_concurrency: 2}"))
    stored = ApiConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert stored.autoscaling is not None and stored.autoscaling.max_replica_concurrency == 5
    assert stored.replica_queue_length == 3  # 5 per replica, 2 of them running
