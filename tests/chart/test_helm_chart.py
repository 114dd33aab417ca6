"""The Helm chart (`deploy/helm/sluice`) as helm sees it: it lints, renders exactly the golden files
under `tests/chart/golden/` for every values file in its `ci/` folder, renders the same with helm 3
and helm 4, and refuses values that cannot run with a message naming the value.

No Kubernetes cluster runs here: what is checked is what helm renders. `tests/unit/test_chart_objects.py`
checks the golden files themselves (schemas at the oldest and newest Kubernetes, KEDA's models,
labels and selectors, the scaling queries against what `/metrics` exports).

After a deliberate change to the chart, write the golden files anew and read their diff:
`SLUICE_UPDATE_GOLDEN=1 pytest tests/chart`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.helm import HelmMissing, helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "sluice"
GOLDEN = Path(__file__).resolve().parent / "golden"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "prod", "ml"  # the release the golden files render


def golden_of(values: Path) -> Path:
    return GOLDEN / values.name.replace("-values.yaml", ".yaml")


def helm_binary(major: int) -> Path:
    try:
        return helm(major)
    except HelmMissing as e:
        pytest.skip(str(e))


def run_helm(major: int, *args: str) -> subprocess.CompletedProcess[str]:
    # HOME and the helm folders are the test's own: no repositories or plugins of the machine's.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(ROOT / ".venv" / "tools"),
           "HELM_CACHE_HOME": str(ROOT / ".venv" / "tools" / "helm-cache"),
           "HELM_CONFIG_HOME": str(ROOT / ".venv" / "tools" / "helm-config"),
           "HELM_DATA_HOME": str(ROOT / ".venv" / "tools" / "helm-data")}
    return subprocess.run([str(helm_binary(major)), *args], capture_output=True, text=True, env=env, timeout=120,
                          check=False)


def render(major: int, *values: Path | str, set_values: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for v in values:
        args += ["-f", str(v)]
    for s in set_values:
        args += ["--set", s]
    return run_helm(major, *args)


def test_every_values_file_the_tests_render_is_kept_in_the_charts_ci_folder() -> None:
    assert {v.name for v in VALUES} == {"default-values.yaml", "sentinel-values.yaml", "gpu-values.yaml",
                                        "scale-to-zero-values.yaml", "internal-redis-values.yaml", "tls-values.yaml"}
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == sorted(golden_of(v).name for v in VALUES)


@pytest.mark.parametrize("major", [3, 4])
@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_the_chart_lints_clean(major: int, values: Path) -> None:
    linted = run_helm(major, "lint", "--strict", str(CHART), "-f", str(values))

    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 chart(s) failed" in linted.stdout


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_helm_renders_the_golden_file(values: Path) -> None:
    rendered = render(4, values)
    assert rendered.returncode == 0, rendered.stderr

    if os.environ.get("SLUICE_UPDATE_GOLDEN"):
        golden_of(values).write_text(rendered.stdout)
    assert rendered.stdout == golden_of(values).read_text(), (
        f"the chart no longer renders {golden_of(values).name}: if the change is meant, run "
        "SLUICE_UPDATE_GOLDEN=1 pytest tests/chart and read the golden file's diff")


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_helm_3_renders_what_helm_4_renders(values: Path) -> None:
    three, four = render(3, values), render(4, values)

    assert three.returncode == 0 and four.returncode == 0, three.stderr + four.stderr
    assert three.stdout == four.stdout


DEFAULT = CHART / "ci" / "default-values.yaml"


@pytest.mark.parametrize(("set_values", "message"), [
    (("redis.url=",), "redis: set exactly one of redis.url, redis.sentinel.hosts and redis.internal.enabled"),
    (("redis.internal.enabled=true", "redis.internal.password=x"), "set exactly one of"),
    (("redis.url=", "redis.sentinel.hosts={s:26379}"), "redis.sentinel.masterName"),
    (("storage.url=/data/storage",), "storage.url: every host reads the deployed bundles"),
    (("auth.apiKeysSecret.name=",), "auth.apiKeysSecret.name: API keys are required"),
    (("replicaPools[0].name=cpu", "replicaPools[0].hardware=inf", "replicaPools[0].resources.requests.cpu=1",
      "replicaPools[0].resources.requests.memory=1Gi"), "at '/replicaPools/0/hardware': value must be one of"),
    (("workerPools[0].enabeld=true",), "additional properties 'enabeld' not allowed"),
    (("batchTimeoutSeconds=0",), "at '/batchTimeoutSeconds': minimum"),
    (("proxy.tls.caKey=ca.crt",), "proxy.tls.caKey: names a key of proxy.tls.secretName, which is not set"),
])
def test_values_that_cannot_run_are_refused_naming_the_value(set_values: tuple[str, ...], message: str) -> None:
    refused = render(4, DEFAULT, set_values=set_values)

    assert refused.returncode != 0
    assert message in refused.stderr, refused.stderr


def test_without_keys_the_chart_runs_only_when_anonymous_is_asked_for() -> None:
    anonymous = render(4, DEFAULT, set_values=("auth.apiKeysSecret.name=", "auth.allowAnonymous=true"))

    assert anonymous.returncode == 0, anonymous.stderr
    assert "SLUICE_API_KEYS_FILE" not in anonymous.stdout
    assert 'name: SLUICE_ALLOW_ANONYMOUS\n              value: "1"' in anonymous.stdout


def test_the_kubernetes_page_opens_with_its_prerequisites_and_its_try_out_values_need_no_keda() -> None:
    page = (ROOT / "docs" / "kubernetes.md").read_text()
    sections = [line for line in page.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Prerequisites"
    prerequisites = page.split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    for needed in ("KEDA", "keda.enabled: false", "Prometheus", "s3://", "Redis", "docker/Dockerfile", "Helm 3.17",
                   "deploy/helm/sluice/ci/internal-redis-values.yaml", "ServiceMonitor"):
        assert needed in prerequisites, needed
    # The values it points to for trying out render no object of KEDA's, so they install on a cluster without it.
    try_out = CHART / "ci" / "internal-redis-values.yaml"
    rendered = render(4, try_out, set_values=("image.repository=registry.example.com/sluice",
                                              "storage.url=s3://your-bucket/sluice"))
    assert rendered.returncode == 0, rendered.stderr
    kinds = {line.split(":", 1)[1].strip() for line in rendered.stdout.splitlines() if line.startswith("kind:")}
    assert "StatefulSet" in kinds and "ScaledObject" not in kinds and "keda.sh" not in rendered.stdout


def test_the_in_chart_redis_without_a_password_gets_a_random_one() -> None:
    # (On a cluster, an upgrade keeps the one the release's Secret holds: helm's `lookup`, which
    # `helm template` cannot do; here, each render makes a new one.)
    first, second = (render(4, DEFAULT, set_values=("redis.url=", "redis.internal.enabled=true")) for _ in range(2))

    def password(rendered: subprocess.CompletedProcess[str]) -> str:
        assert rendered.returncode == 0, rendered.stderr
        documents = rendered.stdout.split("\n---")
        secret = next(doc for doc in documents if "redis-password:" in doc and "kind: Secret" in doc)
        return secret.split("redis-password:", 1)[1].split()[0].strip('"')

    assert len(password(first)) == 32 and password(first).isalnum()
    assert password(first) != password(second)
