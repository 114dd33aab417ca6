"""What the Helm chart renders, read from its golden files (`tests/chart/golden/`, which
`tests/chart/test_helm_chart.py` holds equal to helm's output): every object valid at the oldest and
newest Kubernetes the chart supports, KEDA's objects valid against KEDA's own models, selectors that
select what they should, host pods that offer placement what they request, and scaling queries that
read figures `/metrics` exports. No cluster: these are the objects a cluster would be given.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from prometheus_client.registry import CollectorRegistry

from api.metrics import FiguresCollector
from foundation.host_pools import parse_host_pools
from foundation.hosts import Resources
from foundation.memory import MemoryFigureStore
from jobs.placement.host_demand import HostDemand, PoolFigures
from sluice.cli import main
from sluice.pod_deletion_cost import POD_NAME_VARIABLE, POD_NAMESPACE_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "chart" / "golden"
RENDERINGS = sorted(GOLDEN.glob("*.yaml"))
# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest schemas known.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
HARD_STOP_GRACE_S = 5  # SLUICE_HARD_STOP_GRACE_S's default: the kernel ends a node this long past the limit
WORKLOADS = ("Deployment", "StatefulSet")


@functools.cache
def _parsed(rendering: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(rendering.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if doc]


def objects(rendering: Path) -> list[dict[str, Any]]:
    """The rendering's objects, a copy each call (a test may change them)."""
    return copy.deepcopy(_parsed(rendering))


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [only] = workload["spec"]["template"]["spec"]["containers"]
    return only


def env_of(workload: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload).get("env", [])}


def host_pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in of_kind(docs, "Deployment") if "sluice.dev/pool" in d["metadata"]["labels"]]


def test_there_are_golden_files_to_read() -> None:
    assert len(RENDERINGS) == 6


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_kubernetes_object_is_valid_strictly_at_the_oldest_and_newest_version(rendering: Path,
                                                                                   version: str) -> None:
    for doc in objects(rendering):
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # KEDA's own models check those (below)
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_would_catch_a_misspelt_field() -> None:
    api = named(objects(GOLDEN / "default.yaml"), "Deployment", "prod-sluice-api")
    container(api)["readinesProbe"] = container(api).pop("readinessProbe")

    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, KUBERNETES_VERSIONS[0], strict=True)


def keda_round_trip(doc: dict[str, Any]) -> dict[str, Any]:
    """The object as KEDA's models read it; a field they do not know is dropped, so it shows as a difference."""
    return ScaledObject.model_validate(doc).model_dump(by_alias=True, exclude_none=True, mode="json")


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_every_scaled_object_is_what_kedas_models_read(rendering: Path) -> None:
    for doc in of_kind(objects(rendering), "ScaledObject"):
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        assert keda_round_trip(doc) == doc


def test_the_keda_check_would_catch_an_unknown_field() -> None:
    [scaled] = of_kind(objects(GOLDEN / "default.yaml"), "ScaledObject")[:1]
    scaled["spec"]["minReplicas"] = 0  # KEDA calls it minReplicaCount

    assert keda_round_trip(scaled) != scaled


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_each_workload_selects_its_own_pods_and_no_other(rendering: Path) -> None:
    docs = objects(rendering)
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    pod_labels = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in workloads}
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        selected = [name for name, labels in pod_labels.items() if selector.items() <= labels.items()]
        assert selected == [workload["metadata"]["name"]], f"{workload['metadata']['name']} selects {selected}"


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_services_and_disruption_budgets_select_exactly_one_workloads_pods(rendering: Path) -> None:
    docs = objects(rendering)
    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in WORKLOADS}
    for doc in of_kind(docs, "Service") + of_kind(docs, "PodDisruptionBudget"):
        selector = doc["spec"]["selector"] if doc["kind"] == "Service" else doc["spec"]["selector"]["matchLabels"]
        selected = [name for name, labels in pods.items() if selector.items() <= labels.items()]
        assert selected == [doc["metadata"]["name"]], f"{doc['kind']} {doc['metadata']['name']} selects {selected}"
    budgets = {d["metadata"]["name"] for d in of_kind(docs, "PodDisruptionBudget")}
    assert budgets == {"prod-sluice-api", "prod-sluice-proxy"}


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_the_services_ports_reach_ports_their_pods_name(rendering: Path) -> None:
    docs = objects(rendering)
    by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] in WORKLOADS}
    for service in of_kind(docs, "Service"):
        named = {p["name"] for p in container(by_name[service["metadata"]["name"]]).get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_each_scaled_object_scales_a_host_pool_deployment_without_a_fixed_count(rendering: Path) -> None:
    docs = objects(rendering)
    pools = {d["metadata"]["name"]: d for d in host_pods(docs)}
    for scaled in of_kind(docs, "ScaledObject"):
        target = pools[scaled["spec"]["scaleTargetRef"]["name"]]
        assert "replicas" not in target["spec"]  # KEDA's HPA owns the count; a fixed one would fight it
        assert scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]


def test_beat_runs_alone_and_is_replaced_not_rolled() -> None:
    for rendering in RENDERINGS:
        beat = named(objects(rendering), "Deployment", "prod-sluice-beat")
        assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}


def test_the_api_is_probed_on_healthz() -> None:
    for rendering in RENDERINGS:
        api = named(objects(rendering), "Deployment", "prod-sluice-api")
        for probe in ("readinessProbe", "livenessProbe"):
            assert container(api)[probe]["httpGet"] == {"path": "/healthz", "port": "http"}


# -- what Sluice itself reads -----------------------------------------------------------------------


def exported_names() -> set[str]:
    """Every sample name `/metrics` can show, with beat's host figures present."""
    demand = HostDemand({"workers-cpu": PoolFigures(1, 1, 2)}, {("workers", "cpu"): 1}, 1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(MemoryFigureStore(), lambda: {"cpu": 0}, demand=lambda: demand))
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names |= {sample.name for sample in family.samples}
    return names


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset"}


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query reads: identifiers that are not functions, keywords or label names."""
    without_strings = re.sub(r'"[^"]*"', '""', query)
    without_selectors = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_selectors = re.sub(r"\[[^\]]*\]", "", without_selectors)  # range durations: [5m]
    without_selectors = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "",
                               without_selectors)  # label lists
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", without_selectors):
        rest = without_selectors[match.end():].lstrip()
        if rest.startswith("(") or match.group() in PROMQL_WORDS:
            continue
        names.add(match.group())
    return names


def test_the_query_reader_finds_metric_names_and_only_them() -> None:
    assert metric_names('max(sluice_host_pool_wanted{pool="a",namespace="b"})') == {"sluice_host_pool_wanted"}
    assert metric_names("sum by (pool) (rate(x_total[5m])) + on (api) y") == {"x_total", "y"}


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_every_scaling_query_reads_a_figure_metrics_exports(rendering: Path) -> None:
    exported = exported_names()
    queries = [trigger["metadata"]["query"] for scaled in of_kind(objects(rendering), "ScaledObject")
               for trigger in scaled["spec"]["triggers"] if trigger["type"] == "prometheus"]
    for query in queries:
        assert metric_names(query), query
        assert metric_names(query) <= exported, f"{query} reads {metric_names(query) - exported}, not exported"


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_each_scaled_pool_is_declared_to_beat_and_its_query_names_it(rendering: Path) -> None:
    docs = objects(rendering)
    beat = named(docs, "Deployment", "prod-sluice-beat")
    declared = {pool.name for pool in parse_host_pools(env_of(beat)["SLUICE_HOST_POOLS"])}
    assert declared == {d["metadata"]["labels"]["sluice.dev/pool"] for d in host_pods(docs)}
    for scaled in of_kind(docs, "ScaledObject"):
        [trigger] = scaled["spec"]["triggers"]
        [pool] = re.findall(r'pool="([^"]+)"', trigger["metadata"]["query"])
        assert pool in declared and scaled["spec"]["scaleTargetRef"]["name"] == f"prod-sluice-{pool}"
        assert trigger["metadata"]["threshold"] == "1"  # hosts = the figure: one host per unit wanted


def requested(workload: dict[str, Any]) -> Resources:
    resources = container(workload)["resources"]
    return Resources.parse(cpu=resources["requests"]["cpu"], mem=resources["requests"]["memory"],
                           gpu=int(resources["requests"].get("nvidia.com/gpu", 0)))


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_beat_knows_each_pool_hosts_size_as_its_pods_request_it(rendering: Path) -> None:
    docs = objects(rendering)
    beat = named(docs, "Deployment", "prod-sluice-beat")
    pools = {pool.name: pool for pool in parse_host_pools(env_of(beat)["SLUICE_HOST_POOLS"])}
    for host in host_pods(docs):
        pool = pools[host["metadata"]["labels"]["sluice.dev/pool"]]
        assert pool.offers == requested(host)
        resources = container(host)["resources"]
        extended = {name: n for name, n in resources["requests"].items() if "/" in name}
        assert {name: n for name, n in resources.get("limits", {}).items() if "/" in name} == extended
        assert int(extended.get("nvidia.com/gpu", 0)) == pool.offers.gpu


def cli_args(workload: dict[str, Any], pod: dict[str, str]) -> list[str]:
    """The container's arguments as the kubelet expands them, `$(VAR)` from the pod's values."""
    return [re.sub(r"\$\((\w+)\)", lambda m: pod[m.group(1)], arg) for arg in container(workload)["args"]]


POD = {"SLUICE_HOST_CPU_M": "4000", "SLUICE_HOST_MEM": str(16 * 2**30), "SLUICE_POD_NAME": "prod-sluice-x-5d9-abcde",
       "SLUICE_POD_IP": "10.1.2.3"}


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_host_pods_run_sluices_own_commands_with_options_it_accepts(rendering: Path) -> None:
    for host in host_pods(objects(rendering)):
        assert container(host)["command"] == ["tini", "--"]
        args = cli_args(host, POD)
        assert args[0] == "sluice" and args[1] in ("workers", "replicas"), shlex.join(args)
        command = main.commands[args[1]]
        context = command.make_context(args[1], args[2:])  # an unknown option or a bad value raises here
        assert context.params["pool"] == host["metadata"]["labels"]["sluice.dev/pool"]
        assert context.params["host_id"] == POD["SLUICE_POD_NAME"]
        env = env_of(host)
        assert env[POD_NAME_VARIABLE] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env[POD_NAMESPACE_VARIABLE] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
        assert env["SLUICE_HOST_CPU_M"] == {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}
        if args[1] == "replicas":
            assert context.params["advertise"] == POD["SLUICE_POD_IP"] and context.params["host"] == "0.0.0.0"


@pytest.mark.parametrize("rendering", RENDERINGS, ids=lambda p: p.stem)
def test_a_worker_host_stopping_lets_its_nodes_finish_a_batch_within_the_time_limit(rendering: Path) -> None:
    for host in host_pods(objects(rendering)):
        args = cli_args(host, POD)
        if args[1] != "workers":
            continue
        limit = int(env_of(host)["SLUICE_BATCH_TIMEOUT"])
        stop_grace = float(main.commands["workers"].make_context("workers", args[2:]).params["stop_grace"])
        pod_grace = host["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert limit + HARD_STOP_GRACE_S <= stop_grace < pod_grace


def test_inferentia_hosts_serve_the_inf_queue_and_request_neuron_devices() -> None:
    host = named(objects(GOLDEN / "gpu.yaml"), "Deployment", "prod-sluice-workers-inf")

    assert cli_args(host, POD)[2:4] == ["--queues", "inf"]
    assert container(host)["resources"]["requests"]["aws.amazon.com/neuron"] == 1
    assert not container(host)["image"].endswith("-gpu")


def test_gpu_hosts_request_gpus_run_the_gpu_image_and_tolerate_gpu_nodes() -> None:
    docs = objects(GOLDEN / "gpu.yaml")
    gpu_hosts = [h for h in host_pods(docs) if requested(h).gpu > 0]
    assert {h["metadata"]["name"] for h in gpu_hosts} == {"prod-sluice-workers-a100", "prod-sluice-replicas-gpu"}
    for host in gpu_hosts:
        assert container(host)["image"].endswith("-gpu")
        assert any(t["key"] == "nvidia.com/gpu" for t in host["spec"]["template"]["spec"]["tolerations"])
        assert host["spec"]["template"]["spec"]["nodeSelector"]


def test_a_pool_may_scale_to_zero_where_the_values_say_so() -> None:
    mins = {s["metadata"]["name"]: s["spec"]["minReplicaCount"]
            for s in of_kind(objects(GOLDEN / "scale-to-zero.yaml"), "ScaledObject")}

    assert mins == {"prod-sluice-workers-cpu": 0, "prod-sluice-replicas-cpu": 0}


def test_the_in_chart_redis_is_the_one_every_role_is_given() -> None:
    docs = objects(GOLDEN / "internal-redis.yaml")
    [redis_set] = of_kind(docs, "StatefulSet")
    for workload in of_kind(docs, "Deployment"):
        env = env_of(workload)
        assert env["SLUICE_REDIS_URL"] == "redis://prod-sluice-redis:6379/0"
        assert env["SLUICE_REDIS_PASSWORD"] == {"secretKeyRef": {"name": "prod-sluice-redis", "key": "redis-password"}}
    assert redis_set["spec"]["replicas"] == 1
    assert of_kind(docs, "ScaledObject") == []  # KEDA off: fixed host counts
    assert all("replicas" in d["spec"] for d in host_pods(docs))


def test_sentinels_replace_the_url_and_both_passwords_come_from_secrets() -> None:
    for workload in of_kind(objects(GOLDEN / "sentinel.yaml"), "Deployment"):
        env = env_of(workload)
        assert "SLUICE_REDIS_URL" not in env
        assert env["SLUICE_REDIS_SENTINELS"].count(",") == 2 and env["SLUICE_REDIS_MASTER"] == "sluice"
        assert "secretKeyRef" in env["SLUICE_REDIS_PASSWORD"]
        assert "secretKeyRef" in env["SLUICE_REDIS_SENTINEL_PASSWORD"]
        assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/var/run/sluice/gcs/key.json"


def test_host_pods_may_set_only_pods_in_their_own_namespace() -> None:
    docs = objects(GOLDEN / "default.yaml")
    [role] = of_kind(docs, "Role")
    [binding] = of_kind(docs, "RoleBinding")

    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {h["spec"]["template"]["spec"]["serviceAccountName"] for h in host_pods(docs)} == {
        s["name"] for s in binding["subjects"]}


def test_the_pools_json_reads_back_as_beat_reads_it() -> None:
    beat = named(objects(GOLDEN / "gpu.yaml"), "Deployment", "prod-sluice-beat")
    raw = json.loads(env_of(beat)["SLUICE_HOST_POOLS"])

    assert [p["name"] for p in raw] == ["workers-cpu", "workers-a100", "workers-inf", "replicas-cpu", "replicas-gpu"]
    assert [p["hardware"] for p in raw] == ["cpu", "gpu", "inf", "cpu", "gpu"]


def test_with_tls_the_proxy_serves_the_secrets_pair_and_every_pod_trusts_its_ca() -> None:
    docs = [doc for doc in objects(GOLDEN / "tls.yaml") if doc and doc.get("kind") == "Deployment"]
    assert docs
    for deployment in docs:
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["SLUICE_URL"].startswith("https://") and env["SLUICE_CA_BUNDLE"] == "/etc/sluice/ca/ca.crt"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert mounts["public-ca"] == "/etc/sluice/ca"
        assert volumes["public-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
        if container["args"][1] == "proxy":
            assert (env["SLUICE_TLS_CERT"], env["SLUICE_TLS_KEY"]) == ("/etc/sluice/tls/tls.crt",
                                                                       "/etc/sluice/tls/tls.key")
            assert volumes["public-tls"]["secret"]["secretName"] == "sluice-public-tls"
            assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
