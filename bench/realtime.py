"""Realtime serving: Sluice against a bare gunicorn + Flask app and BentoML (`make bench`).

The same ONNX models as `bench/onnx_batch.py` (iris: 4 features; mlp: ~1.1M parameters), the
same JSON row per request (`{"f0": ..., ...}`), each server answering the model's first output
for that row as JSON. Systems, all with the same processes (and one thread each, unless said):
- (a) baseline: gunicorn (sync workers) running a Flask app that calls onnxruntime directly
  (`bench/realtime_apps.py`);
- (b) Sluice through its public URL (HAProxy, then a replica of the API);
- (c) Sluice's replica directly (its gunicorn, no proxy);
- (d) BentoML serving the same model (`bench/realtime_bento.py`, in its own virtual environment
  made by `make bench`; skipped with a note when absent);
- for the mlps at the highest concurrency: (e) Sluice with server-side batching
  (`max_batch_size` 32, threads 32 per process, gunicorn's gevent worker) against (b), with
  the mean batch size it reached, and (f): (b) with a predictor that parses the rows but
  returns zeros instead of running the model.
Models: iris, mlp (32-1024-1024-10, the target's model) and mlp-wide (32-2048-2048-10, ~4.3M
parameters, run at the highest concurrency only): batching pays in proportion to the share of
a request's cost that is the model's, and the wide one shows it where that share is large.
`cpu/req`: wrk, HAProxy and the replica share this machine's cores, so each run reports the
machine's busy CPU time (from /proc/stat) per answered request. (f)'s is what a request costs
without batching besides its model: batching on the same serving path could save at most the
rest, the model's share; (e) costs less than that because its serving path is cheaper too
(greenlets instead of threads, connections kept alive; sluice/replica_process.py).
Load: wrk (Debian package), one thread, a fixed duration per run, at each concurrency; runs of
different systems are interleaved so drift on the machine hits all alike. Figures: requests/s,
p50 and p99 latency from wrk, and ratios to (a) (requests/s; p50 difference in ms).
Run: `python bench/realtime.py [--duration 10] [--concurrency 1,8,64] [--models iris,mlp]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests
import yaml

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from onnx_batch import iris_model, mlp_model  # noqa: E402

from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

BENTO_VENV = BENCH / ".venv-bentoml"
PREDICTOR = '''import numpy as np


class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client, self.names = onnx_client, [f"f{i}" for i in range(config["features"])]

    def predict(self, payload):
        rows = payload if isinstance(payload, list) else [payload]  # a list under server-side batching
        x = np.array([[row[n] for n in self.names] for row in rows], dtype=np.float32)
        out = self.client.predict(x)[0].tolist()
        return out if isinstance(payload, list) else out[0]
'''
# (f): the same work per request except the model, which it never calls.
PREDICTOR_NO_MODEL = PREDICTOR.replace("self.client.predict(x)[0].tolist()", "np.zeros((len(x), 10), np.float32).tolist()")


@dataclass
class Figures:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    cpu_us: float  # busy CPU time of the whole machine per answered request


def busy_cpu_seconds() -> float:
    """CPU time all cores of this machine spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def model_us_per_row(model_path: Path, features: int, rows: int) -> float:
    """In-process time of one onnxruntime call on `rows` rows, per row (one thread, as the servers)."""
    from realtime_apps import onnx_session

    session = onnx_session(str(model_path))
    feed = {session.get_inputs()[0].name: np.random.default_rng(1).standard_normal((rows, features), np.float32)}
    for _ in range(20):
        session.run(None, feed)
    calls = max(20, 4000 // rows)
    start = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    return (time.perf_counter() - start) / calls / rows * 1e6


def batch_size_totals(stack_url: str, api: str) -> tuple[float, float]:
    """(sum, count) of the stack's `sluice_realtime_batch_size` histogram for one API."""
    from prometheus_client.parser import text_string_to_metric_families

    found = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(requests.get(f"{stack_url}/metrics", timeout=10).text):
        if family.name == "sluice_realtime_batch_size":
            for sample in family.samples:
                kind = sample.name.rsplit("_", 1)[-1]
                if sample.labels.get("api") == api and kind in found:
                    found[kind] = sample.value
    return found["sum"], found["count"]


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}[unit]


def wrk(url: str, body: str, concurrency: int, duration: float, script_dir: Path) -> Figures:
    """One wrk run posting `body` as JSON; requests/s, p50, p99 and failed answers."""
    script = script_dir / "post.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                      'wrk.headers["Content-Type"] = "application/json"\n')
    busy = busy_cpu_seconds()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    ).stdout
    busy = busy_cpu_seconds() - busy
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses:\s+(\d+)", out))
    errors += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    answered = int(re.search(r"(\d+) requests in", out).group(1))
    return Figures(rps, p50, p99, errors, busy / max(answered, 1) * 1e6)


def wait_http(url: str, body: str, log: Path | None = None, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    answer = ""
    while time.monotonic() < deadline:
        try:
            response = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=5)
            if response.ok:
                return
            answer = f"{response.status_code} {response.text[:300]}"
        except requests.RequestException as e:
            answer = str(e)
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s (last: {answer})\n{tail}")


def spawn(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def write_project(folder: Path, api: str, model: bytes, features: int, processes: int,
                  batching: bool, predictor_source: str = PREDICTOR) -> Path:
    (folder / "models" / "1").mkdir(parents=True)
    (folder / "models" / "1" / "model.onnx").write_bytes(model)
    (folder / "predictor.py").write_text(predictor_source)
    predictor = {"type": "onnx", "path": "predictor.py", "models": {"path": "models/"},
                 "config": {"features": features}, "processes_per_replica": processes, "threads_per_process": 1}
    if batching:
        predictor.update(threads_per_process=32, server_side_batching={"max_batch_size": 32, "batch_interval": 0.01})
    (folder / "cortex.yaml").write_text(yaml.safe_dump([{"name": api, "kind": "RealtimeAPI", "predictor": predictor}]))
    return folder / "cortex.yaml"


def replica_url(stack_redis_url: str, api: str) -> str:
    import redis

    from foundation.replica_directory import ReplicaDirectory

    [replica] = ReplicaDirectory(redis.Redis.from_url(stack_redis_url)).routable(time.time(), api)
    return f"http://{replica.address}/{api}"


def wait_proxy_settled(stack_redis_url: str, apis: list[str], timeout: float = 60.0) -> None:
    """Until every proxy routes every replica of `apis` and runs one haproxy worker: a reload
    during a run (a replica becoming routable just after it answered ready) would be measured."""
    import redis

    from foundation.replica_directory import ReplicaDirectory
    from sluice.proxy import routed_everywhere

    client = redis.Redis.from_url(stack_redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.time()
        wanted = {r.replica_id for api in apis for r in ReplicaDirectory(client).routable(now, api)}
        if wanted and routed_everywhere(client, wanted, now):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the proxy did not settle on the replicas of {', '.join(apis)} within {timeout:.0f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--models", default="iris,mlp,mlp-wide")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install -y wrk; `make bench` does it)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sluice-realtime-bench-"))
    stack = None
    servers: list[subprocess.Popen] = []
    rng = np.random.default_rng(0)
    env_one_thread = {"OMP_NUM_THREADS": "1"}
    try:
        stack = Stack(port=free_port(), workers=0, queues=("cpu",), worker_loglevel="WARNING",
                      env=env_one_thread, data_dir=tmp / "stack").start()
        client = Client(stack.url)
        have_bento = (BENTO_VENV / "bin" / "bentoml").exists()
        if not have_bento:
            print(f"note: BentoML not installed in {BENTO_VENV} (`make bench` makes it): (d) skipped\n")
        print(f"{args.processes} processes per system, 1 thread each; wrk 1 thread, {args.duration:g} s per run\n")
        print(f"{'model':>8} {'conc':>4} {'system':<26} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'err':>4} {'x (a) req/s':>11} {'p50 - (a)':>9} {'cpu/req us':>10}")
        for name in args.models.split(","):
            if name == "iris":
                model, data = iris_model()
                features, row = 4, data[rng.integers(0, len(data))].round(1).tolist()
            else:
                model, features = mlp_model((32, 2048, 2048, 10) if name == "mlp-wide" else (32, 1024, 1024, 10)), 32
                row = rng.standard_normal(32).round(4).tolist()
            body = json.dumps({f"f{i}": v for i, v in enumerate(row)})
            model_path = tmp / f"{name}.onnx"
            model_path.write_bytes(model)
            bench_env = {"BENCH_MODEL": str(model_path), "BENCH_FEATURES": str(features),
                         "BENCH_PROCESSES": str(args.processes), **env_one_thread}
            systems: dict[str, str] = {}
            port = free_port()
            servers.append(spawn([sys.executable, "-m", "gunicorn", "-w", str(args.processes), "-b",
                                  f"127.0.0.1:{port}", "--no-control-socket", "realtime_apps:baseline_app()"],
                                 bench_env, BENCH, tmp / f"baseline-{name}.log"))
            systems["(a) gunicorn+flask"] = f"http://127.0.0.1:{port}/predict"
            api = f"{name}-rt"
            client.deploy(write_project(tmp / api, api, model, features, args.processes, batching=False))
            client.wait_ready(api, timeout=120)
            systems["(b) sluice via proxy"] = f"{stack.url}/{api}"
            systems["(c) sluice replica"] = replica_url(stack.redis_url, api)
            if have_bento:
                port = free_port()
                servers.append(spawn([str(BENTO_VENV / "bin" / "bentoml"), "serve", "realtime_bento:OnnxService",
                                      "--port", str(port), "--host", "127.0.0.1"],
                                     bench_env, BENCH, tmp / f"bento-{name}.log"))
                systems["(d) bentoml"] = f"http://127.0.0.1:{port}/predict"
            batched = no_model = None
            if name.startswith("mlp"):
                batched, no_model = f"{name}-rt-batched", f"{name}-rt-no-model"
                client.deploy(write_project(tmp / batched, batched, model, features, args.processes, batching=True))
                client.deploy(write_project(tmp / no_model, no_model, model, features, args.processes, batching=False,
                                            predictor_source=PREDICTOR_NO_MODEL))
                client.wait_ready(batched, timeout=120)
                client.wait_ready(no_model, timeout=120)
            bodies = {label: (json.dumps({"row": json.loads(body)}) if "bentoml" in label else body)
                      for label in systems}
            for label, url in systems.items():
                wait_http(url, bodies[label], tmp / f"{'bento' if 'bentoml' in label else 'baseline'}-{name}.log")
            wait_proxy_settled(stack.redis_url, [a for a in (api, batched, no_model) if a])
            for concurrency in [max(concurrencies)] if name == "mlp-wide" else concurrencies:
                runs = dict(systems)
                if batched is not None and concurrency == max(concurrencies):
                    runs["(e) sluice, batching 32"] = f"{stack.url}/{batched}"
                    runs["(f) sluice, no model"] = f"{stack.url}/{no_model}"
                    bodies["(e) sluice, batching 32"] = bodies["(f) sluice, no model"] = body
                figures = {}
                batches = (0.0, 0.0)
                for label, url in runs.items():
                    wrk(url, bodies[label], concurrency, min(2.0, args.duration), tmp)  # warm up
                    if label.startswith("(e)"):
                        batches = batch_size_totals(stack.url, batched)
                    figures[label] = wrk(url, bodies[label], concurrency, args.duration, tmp)
                    if label.startswith("(e)"):
                        time.sleep(2.5)  # replicas add their figures to Redis about once a second
                        after = batch_size_totals(stack.url, batched)
                        batches = (after[0] - batches[0], after[1] - batches[1])
                base = figures["(a) gunicorn+flask"]
                for label, f in figures.items():
                    print(f"{name:>8} {concurrency:>4} {label:<26} {f.rps:>9,.0f} {f.p50_ms:>7.2f} {f.p99_ms:>7.2f} "
                          f"{f.errors:>4} {f.rps / base.rps:>11.2f} {f.p50_ms - base.p50_ms:>+9.2f} {f.cpu_us:>10,.0f}")
                b = figures["(b) sluice via proxy"]
                if "(d) bentoml" in figures:
                    print(f"{'':>8} {'':>4} (b) / (d) req/s: {b.rps / figures['(d) bentoml'].rps:.2f}")
                if "(e) sluice, batching 32" in figures:
                    e = figures["(e) sluice, batching 32"]
                    many = model_us_per_row(model_path, features, 32)
                    besides = figures["(f) sluice, no model"].cpu_us
                    mean = batches[0] / batches[1] if batches[1] else float("nan")
                    print(f"{'':>8} {'':>4} (e) / (b) req/s: {e.rps / b.rps:.2f} (mean batch {mean:.1f}); "
                          f"CPU per request: (b) {b.cpu_us:,.0f} us, (e) {e.cpu_us:,.0f} us, (f) {besides:,.0f} us "
                          f"without the model, which takes {many:,.0f} us per row in batches of 32")
                sys.stdout.flush()
            for process in servers:
                stop(process)
            servers.clear()
            for deployed in (api, batched, no_model):
                if deployed:
                    client.delete_api(deployed)
    finally:
        for process in servers:
            stop(process)
        if stack is not None:
            stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
