"""Projects that bring their own `requirements.txt` and `dependencies.sh`, as Cortex projects do.

Every package comes from a wheelhouse the tests write (`testbed/wheels.py`), installed by the
real uv with `SLUICE_FIND_LINKS` and `SLUICE_NO_INDEX`: no package index is reached. The stack
is the session's (two worker nodes and realtime replicas); each API's environment is built on
this host by the node or launcher that first needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sluice.client import Client, ClientError
from sluice.embedded import Stack
from testbed.wheels import GREETING, GREETING_MODULE
from tests.integration.conftest import closing_client

pytestmark = pytest.mark.integration

READY_S = 180
ROOT = Path(__file__).resolve().parents[2]

# A predictor that answers, in batch and realtime alike, with the version of the package it imports.
GREETING_PREDICTOR = f'''
import json
import time
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


@pytest.fixture
def env_stack(stack: Stack) -> Stack:
    return stack


@pytest.fixture(autouse=True)
def delete_apis_after(client: Client) -> Any:
    """Each test's APIs go when it ends: idle replicas would share the two cores with the next test."""
    before = {api["name"] for api in client.apis()}
    yield
    for api in client.apis():
        if api["name"] not in before:
            client.delete_api(api["name"], force=True)


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


def wait_for(check: Any, what: str, timeout: float = READY_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_requirement_a_host_cannot_install_leaves_its_api_in_error_naming_the_package_and_no_other_api_affected(
        client: Client, env_stack: Stack, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    good, broken, broken_batch = f"good-{suffix}", f"broken-{suffix}", f"brokenb-{suffix}"
    client.deploy(project(tmp_path / good, good, "RealtimeAPI", requirements=f"{GREETING}==1.0.0\n"))
    client.deploy(project(tmp_path / broken, broken, "RealtimeAPI", requirements="sluice-test-broken==1.0\n"))
    client.deploy(project(tmp_path / broken_batch, broken_batch, "BatchAPI",
                          requirements="sluice-test-broken==1.0\n"))

    def failed() -> dict[str, Any] | None:
        environment = client.get_api(broken)["environment"]
        return environment if environment.get("state") == "failed" else None

    environment = wait_for(failed, "the broken environment to fail")
    assert "sluice-test-broken" in environment["error"] and "Unsupported wheel" in environment["error"]
    wait_for(lambda: any("failed" in r["message"] and "sluice-test-broken" in r["message"]
                         for r in client.get_api(broken)["replicas"]), "the replica to say why it does not start")
    with pytest.raises(ClientError) as refused:
        client.predict(broken, {})
    assert refused.value.http_status == 503
    final = run_job(client, broken_batch, tmp_path / "never.jsonl")
    assert final["status"] == "status_worker_error"
    assert "building the api's environment" in final["message"] and "sluice-test-broken" in final["message"]
    client.wait_ready(good, timeout=READY_S)
    assert client.predict(good, {})["version"] == "1.0.0"
    listed = json.loads(sluice(env_stack, "get", "-o", "json").stdout)
    statuses = {row["name"]: row["status"] for row in listed}
    assert statuses[broken] == statuses[broken_batch] == "error" and statuses[good] == "live"


@pytest.mark.parametrize(("requirements", "named"), [
    ("celery==4.4.7\n", ["celery==4.4.7", "Sluice's own celery 5."]),
    ("sluice-test-old-celery==1.0\n", ["celery<5", "celery 5."]),
])
def test_a_pin_of_a_library_sluice_runs_on_is_refused_at_deploy_naming_both_versions(
        client: Client, tmp_path: Path, requirements: str, named: list[str]) -> None:
    name = f"conflict-{uuid.uuid4().hex[:6]}"
    with pytest.raises(ClientError) as refused:
        client.deploy(project(tmp_path / name, name, "BatchAPI", requirements=requirements))
    assert refused.value.http_status == 400
    assert refused.value.kind == "dependency_conflict"
    for text in named:
        assert text in refused.value.message
    with pytest.raises(ClientError):
        client.get_api(name)  # nothing was deployed


HELPERS = {
    "api.py": "def where():\n    return 'the project api.py'\n",
    "jobs.py": "def where():\n    return 'the project jobs.py'\n",
    "config.py": "SETTING = 'the project config.py'\n",
}
HELPER_PREDICTOR = '''
import api
import config
import jobs


class PythonPredictor:
    def __init__(self, config=None, job_spec=None):
        self.out = (config or {}).get("out")

    def predict(self, payload, batch_id=None):
        import api as again  # imported again at call time, as code does
        answer = {"api": again.where(), "jobs": jobs.where(), "config": config.SETTING}
        if self.out:
            with open(self.out, "a") as out:
                out.write(__import__("json").dumps(answer) + "\\n")
        return answer
'''
EXPECTED = {"api": "the project api.py", "jobs": "the project jobs.py", "config": "the project config.py"}


@pytest.mark.parametrize("requirements", [None, f"{GREETING}==1.0.0\n"], ids=["sluice-environment", "own-environment"])
def test_a_project_with_its_own_api_jobs_and_config_modules_works_in_batch_and_realtime(
        client: Client, tmp_path: Path, requirements: str | None) -> None:
    suffix = uuid.uuid4().hex[:6]
    realtime, batch = f"mods-{suffix}", f"modsb-{suffix}"
    client.deploy(project(tmp_path / realtime, realtime, "RealtimeAPI", requirements=requirements,
                          source=HELPER_PREDICTOR, files=HELPERS))
    client.deploy(project(tmp_path / batch, batch, "BatchAPI", requirements=requirements, source=HELPER_PREDICTOR,
                          files=HELPERS))
    client.wait_ready(realtime, timeout=READY_S)
    assert client.predict(realtime, {}) == EXPECTED
    assert client.predict(realtime, {}) == EXPECTED
    out = tmp_path / "mods.jsonl"
    final = run_job(client, batch, out)
    assert final["status"] == "status_succeeded", final
    assert lines(out) == [EXPECTED] * 3


def test_dependencies_sh_runs_once_per_build_with_the_environments_python_first_on_path(
        client: Client, tmp_path: Path) -> None:
    name = f"shell-{uuid.uuid4().hex[:6]}"
    runs = tmp_path / "runs.txt"
    shell = f'echo "$VIRTUAL_ENV $(command -v python)" >> {runs}\n'
    source = ("class PythonPredictor:\n    def __init__(self, config, job_spec):\n        self.out = config['out']\n"
              "    def predict(self, payload, batch_id):\n        import sys\n"
              "        open(self.out, 'a').write(sys.prefix + '\\n')\n")
    client.deploy(project(tmp_path / name, name, "BatchAPI", shell=shell, source=source))
    out = tmp_path / "prefixes.txt"
    for _ in range(2):
        spec = client.submit_job(name, {"workers": 2, "item_list": {"items": list(range(8)), "batch_size": 1},
                                        "config": {"out": str(out)}})
        assert client.wait_job(name, spec["job_id"], timeout=READY_S)["status"] == "status_succeeded"
    [run] = runs.read_text().splitlines()  # two jobs, on two nodes: built once
    venv, python = run.split()
    assert "/environments/.build-" in venv and python == f"{venv}/bin/python"
    prefixes = set(out.read_text().split())
    assert len(prefixes) == 1 and "/environments/" in prefixes.pop()  # every batch ran in the environment


def sluice(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_CACHE_DIR": str(stack.data_dir / "cache"),  # type: ignore[operator]
           "SLUICE_REDIS_URL": stack.redis_url or "", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "sluice.cli", "--url", stack.url, *args], capture_output=True,
                          text=True, env=env, timeout=READY_S)


def test_sluice_deploy_follows_the_build_and_get_and_env_ls_show_the_environment(env_stack: Stack,
                                                                                   tmp_path: Path) -> None:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    config = project(tmp_path / name, name, "RealtimeAPI", requirements=f"{GREETING}==2.0.0\n")
    deployed = sluice(env_stack, "deploy", str(config))
    assert deployed.returncode == 0, deployed.stderr
    assert f"{GREETING}==2.0.0" in deployed.stdout
    assert "built in" in deployed.stderr  # the build was followed to its end on the host
    # The environment may have been built before (another API of these requirements): its replica's
    # launcher, a process started on placement, takes it only once it runs. Wait for that replica.
    closing_client(env_stack.url).wait_ready(name, timeout=READY_S)
    shown = sluice(env_stack, "get", name)
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("environment:")]
    assert " ready on 1 host (built in " in line and f"{GREETING}==2.0.0" in line
    listed = json.loads(sluice(env_stack, "env", "ls", "-o", "json").stdout)
    key = closing_client(env_stack.url).get_api(name)["environment"]["key"]
    [entry] = [e for e in listed if e["key"] == key]
    assert entry["complete"] and entry["in_use"] and entry["packages"] == {GREETING: "2.0.0"}
    # In use by the replica: pruning with no grace leaves it (and every environment a deployed API names).
    pruned = json.loads(sluice(env_stack, "env", "prune", "--grace", "0", "-o", "json").stdout)
    assert key not in pruned["removed"]
    assert (env_stack.data_dir / "cache" / "environments" / key).is_dir()  # type: ignore[operator]


def test_sluice_deploy_of_a_conflicting_pin_fails_with_both_versions_on_one_line(env_stack: Stack,
                                                                                   tmp_path: Path) -> None:
    name = f"clic-{uuid.uuid4().hex[:6]}"
    refused = sluice(env_stack, "deploy", str(project(tmp_path / name, name, "BatchAPI",
                                                      requirements="celery==4.4.7\n")))
    assert refused.returncode != 0
    assert "celery==4.4.7" in refused.stderr and "Sluice's own celery 5." in refused.stderr


def metric(stack: Stack, name: str) -> float:
    text = requests.get(f"{stack.url}/metrics", timeout=10).text
    [value] = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} ")]
    return value


def test_metrics_count_builds_their_seconds_and_reuses(env_stack: Stack, client: Client, tmp_path: Path) -> None:
    before = {name: metric(env_stack, name) for name in (
        "sluice_environment_builds_total", "sluice_environment_reuses_total", "sluice_environment_build_seconds_total")}
    name = f"figures-{uuid.uuid4().hex[:6]}"
    client.deploy(project(tmp_path / name, name, "BatchAPI", requirements=f"{GREETING}==1.0.0\n",
                          shell=f"# a build of its own: {name}\n"))
    for run in range(2):
        assert run_job(client, name, tmp_path / f"{run}.jsonl")["status"] == "status_succeeded"
    assert metric(env_stack, "sluice_environment_builds_total") == before["sluice_environment_builds_total"] + 1
    assert metric(env_stack, "sluice_environment_reuses_total") >= before["sluice_environment_reuses_total"] + 1
    seconds = "sluice_environment_build_seconds_total"
    assert metric(env_stack, seconds) > before[seconds]


def test_create_api_with_requirements_builds_the_api_an_environment_of_them(client: Client, tmp_path: Path) -> None:
    name = f"create-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "predictor.py").write_text(GREETING_PREDICTOR)
    spec = {"name": name, "kind": "RealtimeAPI", "predictor": {"type": "python", "path": "predictor.py"},
            "compute": {"cpu": 1}}
    [deployed] = client.create_api(spec, requirements=[f"{GREETING}==2.0.0"], project_dir=folder, wait=True)
    assert deployed["environment"]["packages"] == {GREETING: "2.0.0"}
    assert client.predict(name, {})["version"] == "2.0.0"
    assert not (folder / "requirements.txt").exists()  # the user's folder is left as it was
    with pytest.raises(ClientError) as refused:
        client.create_api(spec, conda_packages=["rdkit"], project_dir=folder)
    assert "requirements=" in refused.value.message


def test_a_replica_whose_predictor_cannot_import_tells_callers_one_line_and_operators_the_traceback(
        client: Client, tmp_path: Path) -> None:
    name = f"noimport-{uuid.uuid4().hex[:6]}"
    source = "import sluice_test_not_installed_anywhere\n\nclass PythonPredictor:\n    pass\n"
    client.deploy(project(tmp_path / name, name, "RealtimeAPI", source=source))

    def refused() -> ClientError | None:
        try:
            client.predict(name, {})
        except ClientError as e:
            return e if "ModuleNotFoundError" in e.message else None
        return None

    answer = wait_for(refused, "the replica to answer why it is not ready")
    assert answer.http_status == 503 and answer.kind == "not_ready"
    assert "No module named 'sluice_test_not_installed_anywhere'" in answer.message
    assert "Traceback" not in answer.message and "/bundles/" not in answer.message
    replicas = wait_for(lambda: [r for r in client.get_api(name)["replicas"] if "Traceback" in r["message"]],
                        "the replica's record to carry the traceback")
    assert "predictor.py" in replicas[0]["message"]


def test_a_predictor_process_that_dies_mid_batch_fails_that_try_only_and_is_started_again_for_the_next(
        client: Client, tmp_path: Path) -> None:
    name = f"dies-{uuid.uuid4().hex[:6]}"
    flag, out = tmp_path / "died-once", tmp_path / "out.jsonl"
    source = GREETING_PREDICTOR.replace(
        "    def predict(self, payload, batch_id=None):\n",
        "    def predict(self, payload, batch_id=None):\n"
        "        import os, pathlib\n"
        f"        if not pathlib.Path({str(flag)!r}).exists():\n"
        f"            pathlib.Path({str(flag)!r}).touch()\n"
        "            os._exit(9)  # the environment's process dies, as on an out-of-memory kill\n")
    client.deploy(project(tmp_path / name, name, "BatchAPI", requirements=f"{GREETING}==1.0.0\n", source=source))
    spec = client.submit_job(name, {"workers": 1, "item_list": {"items": list(range(4)), "batch_size": 2},
                                    "config": {"out": str(out)},
                                    "sqs_dead_letter_queue": {"arn": "x", "max_receive_count": 2}})
    final = client.wait_job(name, spec["job_id"], timeout=READY_S)
    assert final["status"] == "status_succeeded", final  # the died try was tried again, in a new process
    assert sorted(row["item"] for row in lines(out)) == list(range(4))
    assert flag.exists()


def test_a_realtime_api_building_its_environment_and_starting_is_never_called_an_error(
        env_stack: Stack, client: Client, tmp_path: Path) -> None:
    from sluice.cli.render import realtime_status  # what `sluice get` shows in its status column

    name = f"start-{uuid.uuid4().hex[:6]}"
    client.deploy(project(tmp_path / name, name, "RealtimeAPI", requirements=f"{GREETING}==1.0.0\n"))
    seen: list[str] = []
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline and seen[-1:] != ["live"]:
        status = realtime_status(client.api(name))
        if seen[-1:] != [status]:
            seen.append(status)
        time.sleep(0.05)

    assert seen[-1] == "live", seen
    assert "starting" in seen and not {"error", "live (with errors)"} & set(seen), seen


def test_an_old_pin_with_no_wheel_for_this_python_is_refused_naming_the_oldest_release_that_has_one(
        client: Client, tmp_path: Path) -> None:
    from testbed.wheels import OLD_BUILD

    name = f"old-{uuid.uuid4().hex[:6]}"
    config = project(tmp_path / name, name, "BatchAPI", requirements=f"{OLD_BUILD}==1.0\n")

    with pytest.raises(ClientError) as refused:
        client.deploy(config)

    first_line = refused.value.server_message.splitlines()[0]
    assert refused.value.http_status == 400
    assert f"{OLD_BUILD}==1.0 has no wheel for Python {sys.version_info.major}.{sys.version_info.minor}" in first_line
    assert first_line.endswith(f"the oldest release with one is {OLD_BUILD}==2.0")


OLD_BUILD_PREDICTOR = '''
import json
import sluicetestoldbuild


class PythonPredictor:
    def __init__(self, config, job_spec=None):
        self.out = config["out"]

    def predict(self, payload, batch_id=None):
        with open(self.out, "a") as out:
            out.write(json.dumps({"version": sluicetestoldbuild.VERSION}) + "\\n")
'''


def test_nearest_wheels_moves_an_old_pin_and_a_pin_of_sluices_own_saying_each_move(
        client: Client, tmp_path: Path) -> None:
    from testbed.wheels import OLD_BUILD

    name = f"nearest-{uuid.uuid4().hex[:6]}"
    celery = lines_of_sluice_pin("celery")
    config = project(tmp_path / name, name, "BatchAPI", source=OLD_BUILD_PREDICTOR,
                     requirements=f"{OLD_BUILD}==1.0\ncelery==4.4.7\n")

    [deployed] = client.deploy(config, nearest_wheels=True)

    moved = deployed["environment"]["moved"]
    assert moved == [f"celery==4.4.7 -> celery=={celery}: Sluice's own celery, which its nodes and replicas run on",
                     f"{OLD_BUILD}==1.0 -> {OLD_BUILD}==2.0: the oldest release with a wheel for Python "
                     f"{sys.version_info.major}.{sys.version_info.minor} on {sysconfig.get_platform()}"]
    assert client.api(name)["environment"]["moved"] == moved  # kept: `sluice get` shows it
    out = tmp_path / "versions.jsonl"
    assert run_job(client, name, out, items=2)["status"] == "status_succeeded"
    assert {line["version"] for line in lines(out)} == {"2.0"}  # the moved pin is what the nodes run


def lines_of_sluice_pin(package: str) -> str:
    from importlib.metadata import version

    return version(package)
