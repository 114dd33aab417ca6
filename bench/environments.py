"""Per-API environments: what a project's own `requirements.txt` costs at deploy and at first use.

On the embedded stack (one worker node, realtime replicas on this host), a small project is
deployed again and again under new names, and the time from `deploy` to its first answer is
measured in three cases, interleaved round by round:
- (plain) no requirements: the API runs in Sluice's own environment (the baseline);
- (cold) `requirements.txt` with a handful of pure-Python packages and a `dependencies.sh` of its
  own (so a new environment is built on this host: uv's cache is warm after the first round, as on
  any host that has built before, but the environment itself is new);
- (warm) the same files under another API name: the environment is already built on the host.
For a RealtimeAPI "first answer" is the first 200 to `POST /<name>`; for a BatchAPI it is the end
of a one-batch job submitted right after the deploy. Beside them, uv's own time to make a venv
and install the same packages into it (the floor a cold build cannot beat), and the disk one
environment takes.

Printed: medians over the rounds; warm/plain (goal: within 1.10x) and cold - plain against uv's
own install time (goal: no more than a few seconds over it).

Every package comes from a wheelhouse this bench writes (no package index is reached).

Run: `python bench/environments.py [--rounds 3] [--packages 5]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from sluice.client import Client, ClientError  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402
from testbed.wheels import make_wheel  # noqa: E402

PREDICTOR = """
{imports}

class PythonPredictor:
    def __init__(self, config, job_spec=None):
        pass

    def predict(self, payload, batch_id=None):
        return {{"ok": True}}
"""


def wheelhouse(folder: Path, count: int) -> list[str]:
    """`count` pure-Python packages of 40 modules each (about the size of a small utility library)."""
    names = []
    for i in range(count):
        name = f"sluice-bench-pkg{i}"
        module = f"sluicebenchpkg{i}"
        files = {f"{module}/__init__.py": "VALUE = 1\n"}
        for m in range(40):
            files[f"{module}/part{m}.py"] = "".join(f"def f{j}(x):\n    return x + {j}\n\n" for j in range(50))
        make_wheel(folder, name, "1.0.0", files)
        names.append(name)
    return names


def project(root: Path, name: str, kind: str, packages: list[str] | None, shell_tag: str | None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    imports = "\n".join(f"import sluicebenchpkg{i}" for i in range(len(packages or [])))
    (folder / "predictor.py").write_text(PREDICTOR.format(imports=imports))
    if packages:
        (folder / "requirements.txt").write_text("".join(f"{p}==1.0.0\n" for p in packages))
        (folder / "dependencies.sh").write_text(f"# environment {shell_tag}\ntrue\n")
    api = {"name": name, "kind": kind, "predictor": {"type": "python", "path": "predictor.py"}, "compute": {"cpu": 1}}
    (folder / "cortex.yaml").write_text(yaml.safe_dump([api], sort_keys=False))
    return folder / "cortex.yaml"


def first_answer(client: Client, config: Path, name: str, kind: str) -> float:
    started = time.perf_counter()
    client.deploy(config)
    if kind == "RealtimeAPI":
        while True:
            try:
                client.predict(name, {})
                break
            except ClientError as e:
                if e.http_status not in (0, 502, 503, 504):
                    raise
            time.sleep(0.02)
    else:
        spec = client.submit_job(name, {"workers": 1, "item_list": {"items": [1], "batch_size": 1}})
        final = client.wait_job(name, spec["job_id"], timeout=600)
        assert final["status"] == "status_succeeded", final
    seconds = time.perf_counter() - started
    client.delete_api(name, force=True)
    return seconds


def uv_install_s(wheels: Path, packages: list[str], cache: Path) -> float:
    """uv's own: a new venv and the packages installed into it from the wheelhouse, warm cache."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or "uv"
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, f"{tmp}/v"], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--python", f"{tmp}/v/bin/python", "--no-index", "--find-links",
                        str(wheels), "--cache-dir", str(cache), *(f"{p}==1.0.0" for p in packages)], check=True)
        return time.perf_counter() - started


def disk_mib(path: Path) -> float:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--packages", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-env-"))
    wheels = work / "wheels"
    packages = wheelhouse(wheels, args.packages)
    env = {"SLUICE_FIND_LINKS": str(wheels), "SLUICE_NO_INDEX": "1", "SLUICE_BEAT_INTERVAL": "1"}
    times: dict[tuple[str, str], list[float]] = {}
    uv_times = []
    try:
        with Stack(port=free_port(), workers=1, data_dir=work / "stack", env=env) as stack:
            client = Client(stack.url)
            uv_install_s(wheels, packages, work / "uv-cache")  # warm the bench's own uv cache once
            for round_ in range(args.rounds):
                for kind in ("RealtimeAPI", "BatchAPI"):
                    tag = uuid.uuid4().hex[:8]
                    cases = [("plain", None), ("cold", packages), ("warm", packages)]
                    for case, wanted in cases:
                        name = f"{case}-{kind[0].lower()}-{tag}"
                        config = project(work / "projects", name, kind, wanted, tag)
                        seconds = first_answer(client, config, name, kind)
                        times.setdefault((kind, case), []).append(seconds)
                uv_times.append(uv_install_s(wheels, packages, work / "uv-cache"))
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
            environments = [p for p in (work / "stack" / "cache" / "environments").iterdir()
                            if not p.name.startswith(".")]
            sizes = [disk_mib(p) for p in environments]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    uv_s = statistics.median(uv_times)
    print(f"\n{args.packages} pure-Python packages of 40 modules; medians of {args.rounds} rounds; "
          f"uv's own venv + install (warm cache): {uv_s:.2f} s")
    print(f"{'api':<12} {'plain s':>8} {'cold s':>8} {'warm s':>8} {'warm/plain':>11} {'cold-plain s':>13}")
    for kind in ("RealtimeAPI", "BatchAPI"):
        plain, cold, warm = (statistics.median(times[(kind, case)]) for case in ("plain", "cold", "warm"))
        print(f"{kind:<12} {plain:>8.2f} {cold:>8.2f} {warm:>8.2f} {warm / plain:>10.2f}x {cold - plain:>13.2f}")
    print(f"disk per environment: {statistics.median(sizes):.2f} MiB (median of {len(sizes)}; "
          "packages hard-linked from uv's cache count once per filesystem)")
    print("goals: warm/plain within 1.10x; cold - plain no more than a few seconds over uv's own install time")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
