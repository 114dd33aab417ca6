"""Projects that bring their own `requirements.txt` and `dependencies.sh`, as Cortex projects do.

Every package comes from a wheelhouse the tests write (`tests/wheelhouse.py`), installed by the
real uv with `SLUICE_FIND_LINKS` and `SLUICE_NO_INDEX`: no package index is reached. The stack
is the embedded one with two worker nodes and realtime replicas; each API's environment is
built on this host by the node or launcher that first needs it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.client import Client
from sluice.embedded import Stack, free_port
from tests.integration.conftest import FAST_LOOPS, ROOM, closing_client
from tests.wheelhouse import GREETING, GREETING_MODULE, make_wheelhouse

pytestmark = pytest.mark.integration

READY_S = 180

# A predictor that answers, in batch and realtime alike, with the version of the package it imports.
GREETING_PREDICTOR = f'''
import json
import {GREETING_MODULE}


class PythonPredictor:
    def __init__(self, config, job_spec=None):
        self.config = config

    def predict(self, payload, batch_id=None):
        answer = {{"version": {GREETING_MODULE}.VERSION, "greeting": {GREETING_MODULE}.greet("sluice")}}
        if batch_id is not None:
            with open(self.config["out"], "a") as out:
                for item in payload:
                    out.write(json.dumps({{"item": item, **answer}}) + "\\n")
        return answer
'''


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheelhouse(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="module")
def env_stack(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path):
    data_dir = tmp_path_factory.mktemp("environments-stack")
    env = {**FAST_LOOPS, "SLUICE_FIND_LINKS": str(wheelhouse), "SLUICE_NO_INDEX": "1"}
    with Stack(port=free_port(), offers=ROOM, workers=2, data_dir=data_dir, env=env) as running:
        yield running
        print(running.logs())


@pytest.fixture(scope="module")
def client(env_stack: Stack) -> Client:
    return closing_client(env_stack.url)


def project(folder: Path, name: str, kind: str, *, requirements: str | None = None, shell: str | None = None,
            source: str = GREETING_PREDICTOR, files: dict[str, str] | None = None,
            predictor: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "predictor.py").write_text(source)
    if requirements is not None:
        (folder / "requirements.txt").write_text(requirements)
    if shell is not None:
        (folder / "dependencies.sh").write_text(shell)
    for relative, text in (files or {}).items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    api = {"name": name, "kind": kind, "predictor": {"type": "python", "path": "predictor.py", **(predictor or {})},
           "compute": {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


def run_job(client: Client, name: str, out: Path, items: int = 6) -> dict[str, Any]:
    spec = client.submit_job(name, {"workers": 1, "item_list": {"items": list(range(items)), "batch_size": 2},
                                    "config": {"out": str(out)}})
    return client.wait_job(name, spec["job_id"], timeout=READY_S)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def environments_on(stack: Stack) -> list[Path]:
    root = stack.data_dir / "cache" / "environments"  # type: ignore[operator]
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


def test_two_apis_pinning_two_versions_of_one_package_run_side_by_side_in_batch_and_realtime(
        client: Client, env_stack: Stack, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    names = {version: f"greet-{version[0]}-{suffix}" for version in ("1.0.0", "2.0.0")}
    for version, name in names.items():
        deployed = client.deploy(project(tmp_path / f"rt-{name}", name, "RealtimeAPI",
                                         requirements=f"{GREETING}=={version}\n"))
        assert deployed[0]["environment"]["packages"] == {GREETING: version}
        client.deploy(project(tmp_path / f"batch-{name}", f"b{name}", "BatchAPI",
                              requirements=f"{GREETING}=={version}\n"))
    for name in names.values():
        client.wait_ready(name, timeout=READY_S)
    for _ in range(3):  # both answer, each with its own version, one after the other
        for version, name in names.items():
            assert client.predict(name, {}) == {"version": version, "greeting": f"hello sluice from {version}"}
    for version, name in names.items():
        out = tmp_path / f"{name}.jsonl"
        final = run_job(client, f"b{name}", out)
        assert final["status"] == "status_succeeded", final
        assert sorted(row["item"] for row in lines(out)) == list(range(6))
        assert {row["version"] for row in lines(out)} == {version}
    shown = client.get_api(names["2.0.0"])["environment"]
    assert shown["state"] == "ready" and shown["packages"] == {GREETING: "2.0.0"}
    assert all(host["state"] == "ready" and host["seconds"] > 0 for host in shown["hosts"].values())


def test_an_api_without_requirements_runs_in_sluices_own_environment(client: Client, env_stack: Stack,
                                                                        tmp_path: Path) -> None:
    before = environments_on(env_stack)
    name = f"plain-{uuid.uuid4().hex[:6]}"
    source = "class PythonPredictor:\n    def __init__(self, config):\n        pass\n" \
             "    def predict(self, payload):\n        import sys\n        return {'python': sys.executable}\n"
    deployed = client.deploy(project(tmp_path / name, name, "RealtimeAPI", source=source))
    assert deployed[0]["environment"] is None
    client.wait_ready(name, timeout=READY_S)
    assert "/environments/" not in client.predict(name, {})["python"]
    assert environments_on(env_stack) == before
