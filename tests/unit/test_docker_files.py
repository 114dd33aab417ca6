"""docker/compose.yaml and docker/Dockerfile, checked for what would break a deployment without
building or running an image: every command names a command and options that exist, only the
proxy is published, the GPU services are GPU services, every Sluice service finds Redis and
the shared storage.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from sluice.cli import host_capacity
from sluice.cli import main as sluice_cli
from sluice.replica_manager import STOP_GRACE_S

DOCKER = Path(__file__).resolve().parents[2] / "docker"
EXPECTED_SERVICES = {"redis", "api", "proxy", "worker-cpu", "worker-gpu", "beat", "replicas", "replicas-gpu",
                     "prometheus", "grafana"}
GPU_SERVICES = {"worker-gpu", "replicas-gpu"}


@functools.cache
def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def sluice_services() -> list[str]:
    """The services run from Sluice's own image (all but redis)."""
    return sorted(name for name, service in services().items() if "build" in service)


def commands_of(program: str) -> list[str]:
    return sorted(name for name, service in services().items() if service.get("command", [None])[0] == program)


def sluice_params(service: str) -> dict[str, Any]:
    """What `sluice` makes of the service's command line (without running it)."""
    _, command, *args = services()[service]["command"]
    return sluice_cli.commands[command].make_context(command, args).params


def gunicorn_options(service: str):
    from gunicorn.config import Config

    return Config().parser().parse_args(services()[service]["command"][1:])


def seconds(duration: str) -> float:
    """A compose duration such as "90s", "2m" or "1m30s"."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[u] for n, u in parts)


def stages() -> list[str]:
    return re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)", (DOCKER / "Dockerfile").read_text(), re.MULTILINE | re.IGNORECASE)


# -- the commands --------------------------------------------------------------------------------
def test_compose_runs_every_role():
    assert set(services()) == EXPECTED_SERVICES


@pytest.mark.parametrize("service", commands_of("sluice"))
def test_every_sluice_command_names_a_command_and_options_that_exist(service):
    _, command, *args = services()[service]["command"]
    assert command in sluice_cli.commands, f"{service}: no `sluice {command}`"
    try:
        sluice_cli.commands[command].make_context(command, list(args))
    except click.ClickException as e:
        pytest.fail(f"{service}: `sluice {command} {' '.join(args)}`: {e.format_message()}")


@pytest.mark.parametrize("service", commands_of("celery"))
def test_every_celery_command_loads_the_app_and_parses(service):
    from celery.app.utils import find_app
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery as celery_cli

    program, app_flag, app_name, command, *args = services()[service]["command"]
    assert (program, app_flag) == ("celery", "-A"), "written as `celery -A APP COMMAND ...`"
    app = find_app(app_name)  # what -A does: import it, find the Celery app (connects to nothing)
    assert command in celery_cli.commands
    try:
        celery_cli.commands[command].make_context(command, list(args), obj=CLIContext(app, True, None))
    except click.ClickException as e:
        pytest.fail(f"{service}: `celery {command} {' '.join(args)}`: {e.format_message()}")


@pytest.mark.parametrize("service", commands_of("gunicorn"))
def test_every_gunicorn_command_parses_and_names_an_app_factory_that_exists(service):
    options = gunicorn_options(service)
    [app] = options.args
    module, _, factory = app.partition(":")
    assert factory.endswith("()"), "an app factory, called by gunicorn"
    assert callable(getattr(importlib.import_module(module), factory[:-2]))


def test_redis_keeps_an_append_only_file_on_a_volume():
    redis = services()["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "healthcheck" in redis


# -- the network -------------------------------------------------------------------------------------
def test_only_the_proxy_publishes_a_port_and_it_is_the_proxys_public_port():
    published = {name: service["ports"] for name, service in services().items() if service.get("ports")}
    # Grafana's dashboards are published on the host's loopback only.
    assert published.pop("grafana") == ["127.0.0.1:3000:3000"]
    assert list(published) == ["proxy"]
    proxy = sluice_params("proxy")
    assert proxy["bind"] == "0.0.0.0"
    assert published["proxy"] == [f"{proxy['port']}:{proxy['port']}"]


def test_the_proxy_sends_management_paths_to_the_api_services_gunicorn():
    host, _, port = sluice_params("proxy")["management"].rpartition(":")
    assert host == "api"
    [bind] = gunicorn_options("api").bind
    assert bind == f"0.0.0.0:{port}"
    assert f":{port}/healthz" in " ".join(services()["api"]["healthcheck"]["test"])
    assert services()["proxy"]["depends_on"]["api"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", ["replicas", "replicas-gpu"])
def test_replicas_listen_where_the_proxy_reaches_them_and_call_apis_through_it(service):
    params = sluice_params(service)
    assert params["host"] == "0.0.0.0"
    assert params["advertise"] not in ("127.0.0.1", "localhost")  # the proxy is another container
    assert services()[service]["environment"]["SLUICE_API_URL"] == f"http://proxy:{sluice_params('proxy')['port']}"
    # On stop every replica drains and finishes its requests before compose kills the container.
    assert seconds(services()[service]["stop_grace_period"]) > STOP_GRACE_S


# -- hardware ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("service", sorted(EXPECTED_SERVICES))
def test_gpu_services_have_the_gpu_profile_a_gpu_and_the_gpu_image_and_no_other_does(service):
    definition = services()[service]
    devices = definition.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    gpus = [d for d in devices if "gpu" in d.get("capabilities", [])]
    if service in GPU_SERVICES:
        assert definition["profiles"] == ["gpu"]
        assert gpus and all(d["driver"] == "nvidia" for d in gpus)
        assert definition["build"]["target"] == "gpu"
    else:
        assert "profiles" not in definition and not gpus
        assert definition.get("build", {}).get("target", "cpu") == "cpu"


def test_each_kind_of_host_takes_its_own_work():
    assert "-Q" in services()["worker-cpu"]["command"] and "-Q" in services()["worker-gpu"]["command"]
    for service, queue in (("worker-cpu", "cpu"), ("worker-gpu", "gpu")):
        command = services()[service]["command"]
        assert command[command.index("-Q") + 1] == queue
    assert hardware_of(sluice_params("replicas")) == "cpu"
    assert hardware_of(sluice_params("replicas-gpu")) == "gpu"


def hardware_of(params: dict) -> str | None:
    """The kind of realtime APIs a `sluice replicas` host takes, from its parsed options."""
    return host_capacity(params["cpu"], params["mem"], params["gpu"], params["only"])[1]


def test_every_build_target_is_a_stage_of_the_dockerfile_and_the_default_is_the_cpu_image():
    targets = {service["build"]["target"] for service in services().values() if "build" in service}
    assert targets <= set(stages())
    assert stages()[-1] == "cpu"  # `docker build` without --target


# -- shared state --------------------------------------------------------------------------------------
@pytest.mark.parametrize("service", sluice_services())
def test_every_sluice_service_finds_redis_and_the_shared_storage(service):
    definition = services()[service]
    env = definition["environment"]
    redis_url = urlsplit(env["SLUICE_REDIS_URL"])
    assert redis_url.scheme == "redis" and redis_url.hostname in services()
    assert definition["depends_on"][redis_url.hostname]["condition"] == "service_healthy"
    mounts = dict(volume.split(":", 1)[::-1] for volume in definition["volumes"])
    assert mounts[env["SLUICE_STORAGE"]] == "storage" and "storage" in compose()["volumes"]
    assert definition["restart"] == "unless-stopped" and definition["init"] is True


# -- the image ---------------------------------------------------------------------------------------
def test_the_image_installs_haproxy_and_the_project():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"apt-get install[^\n]*\bhaproxy\b", dockerfile)
    assert re.search(r"^COPY \. /app$", dockerfile, re.MULTILINE)
    assert re.search(r"uv sync --locked --no-editable", dockerfile)  # the project, as the lock has it


def test_the_build_context_leaves_local_environments_out():
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".git", ".venv"} <= set(ignored)


# -- metrics -----------------------------------------------------------------------------------------
def test_prometheus_scrapes_the_api_services_gunicorn_with_an_api_key():
    config = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    [bind] = gunicorn_options("api").bind
    assert job["static_configs"] == [{"targets": [f"api:{bind.rpartition(':')[2]}"]}]
    assert job["metrics_path"] == "/metrics"
    key_file = job["authorization"]["credentials_file"]
    assert key_file in " ".join(services()["prometheus"]["entrypoint"])  # written before Prometheus starts
    mounted = {volume.split(":")[1] for volume in services()["prometheus"]["volumes"]}
    assert "/etc/prometheus/prometheus.yml" in mounted and "/prometheus" in mounted


def test_the_grafana_dashboard_reads_only_figures_sluice_exports():
    from foundation.figures import CATALOGUE, Kind

    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "sluice.json").read_text())
    exported = {"sluice_queue_depth"}
    for figure in CATALOGUE.values():
        if figure.kind is Kind.HISTOGRAM:
            exported |= {f"{figure.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
        else:
            exported.add(figure.name)
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\bsluice_[a-z_]+", target["expr"])}
    assert used and used <= exported, used - exported
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("jobs", "throughput", "duration", "requests", "latency", "rejections", "queue depth", "errors"):
        assert topic in titles
    datasource = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    [source] = datasource["datasources"]
    assert source["url"] == "http://prometheus:9090"
    assert {panel["datasource"]["uid"] for panel in dashboard["panels"]} == {source["uid"]}
