"""Realtime serving: Sluice against a bare gunicorn + Flask app and BentoML (`make bench`).

The same ONNX models as `bench/onnx_batch.py` (iris: 4 features; mlp: ~1.1M parameters), the
same JSON row per request (`{"f0": ..., ...}`), each server answering the model's first output
for that row as JSON. Systems, all with the same processes (and one thread each, unless said):
- (a) baseline: gunicorn (sync workers) running a Flask app that calls onnxruntime directly
  (`bench/realtime_apps.py`);
- (b) Sluice through its public URL (HAProxy, then a replica of the API); (b tls) the same through
  a second proxy on the same replicas that serves TLS (`sluice proxy --tls-cert/--tls-key`, a
  certificate made for the run; wrk keeps its connections, so this is TLS's cost per request once
  the handshake is done), printed as (b tls) / (b);
- (c) Sluice's replica directly (its gunicorn, no proxy); `the hop` prints (b) / (c), what the public
  address costs against the replica it forwards to;
- (d) BentoML serving the same model (`bench/realtime_bento.py`, in its own virtual environment
  made by `make bench`; skipped with a note when absent);
- for the mlps at the highest concurrency: (e) Sluice with server-side batching
  (`max_batch_size` 32, threads 32 per process, gunicorn's gevent worker) against (b), with
  the mean batch size it reached, and (f): (b) with a predictor that parses the rows but
  returns zeros instead of running the model.
Models: iris, mlp (32-1024-1024-10, the target's model) and mlp-wide (32-2048-2048-10, ~4.3M
parameters, run at the highest concurrency only): batching pays in proportion to the share of
a request's cost that is the model's, and the wide one shows it where that share is large.
tf-mlp (highest concurrency only) is the mlp's network as a TensorFlow SavedModel, served by
Cortex's unchanged one-payload `TensorFlowPredictor` through the proxy: (g) without batching
and (h) with `server_side_batching` (32, as (e)), where the replica gathers the concurrent
`tensorflow_client.predict` calls into shared runs of the model; it prints (h) / (g) and the
mean number of calls per run. TensorFlow gets one intra-op and one inter-op thread, as the
ONNX sessions get one thread.
`cpu/req`: wrk, HAProxy and the replica share this machine's cores, so each run reports the
machine's busy CPU time (from /proc/stat) per answered request. (f)'s is what a request costs
without batching besides its model: batching on the same serving path could save at most the
rest, the model's share; (e) costs less than that because its serving path is cheaper too
(greenlets instead of threads, connections kept alive; sluice/replica_process.py).
Load: wrk (Debian package), one thread, a fixed duration per run, at each concurrency; runs of
different systems are interleaved so drift on the machine hits all alike. Figures: requests/s,
p50 and p99 latency from wrk, and ratios to (a) (requests/s; p50 difference in ms).
Run: `python bench/realtime.py [--duration 10] [--concurrency 1,8,64] [--models iris,mlp,tf-mlp]`
(`--models tf-mlp` runs the TensorFlow systems alone).
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
from itertools import pairwise
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
from sluice.tls.self_signed import make_self_signed  # noqa: E402

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
PREDICTOR_NO_MODEL = PREDICTOR.replace("self.client.predict(x)[0].tolist()",
                                      "np.zeros((len(x), 10), np.float32).tolist()")
# (g) and (h): a Cortex TensorFlowPredictor, one payload per predict with or without batching.
TF_PREDICTOR = '''
class TensorFlowPredictor:
    def __init__(self, tensorflow_client, config):
        self.client, self.names = tensorflow_client, [f"f{i}" for i in range(config["features"])]

    def predict(self, payload):
        return self.client.predict([[payload[n] for n in self.names]])["y"]  # the one row's values, flat
'''
TF_ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


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


def wait_http(url: str, body: str, log: Path | None = None, timeout: float = 120.0, verify: str | bool = True) -> None:
    deadline = time.monotonic() + timeout
    answer = ""
    while time.monotonic() < deadline:
        try:
            response = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=5,
                                     verify=verify)
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


def save_tf_mlp(folder: Path, sizes: tuple[int, ...] = (32, 1024, 1024, 10), seed: int = 0) -> None:
    """The network of `onnx_batch.mlp_model` (same weights) as a SavedModel: `serving_default` maps
    `x` [None, 32] to `y` [None, 10]."""
    os.environ.update(TF_ONE_THREAD)  # read when TensorFlow starts: this process measures it as the replicas run it
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    layers = [(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
              for n_in, n_out in pairwise(sizes)]

    class Mlp(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = [tf.Variable(w) for w in layers]

        @tf.function(input_signature=[tf.TensorSpec([None, sizes[0]], tf.float32, name="x")])
        def serve(self, x):
            for i, w in enumerate(self.weights):
                x = tf.matmul(x, w)  # the biases are zeros, as in the ONNX model
                if i < len(self.weights) - 1:
                    x = tf.nn.relu(x)
            return {"y": x}

    module = Mlp()
    tf.saved_model.save(module, str(folder), signatures={"serving_default": module.serve})


def tf_us_per_row(model_dir: Path, features: int, rows: int) -> float:
    """In-process time of one run of the SavedModel's signature on `rows` rows, per row."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    x = tf.constant(np.random.default_rng(1).standard_normal((rows, features), np.float32))
    for _ in range(20):
        signature(x=x)["y"].numpy()
    calls = max(20, 2000 // rows)
    start = time.perf_counter()
    for _ in range(calls):
        signature(x=x)["y"].numpy()
    return (time.perf_counter() - start) / calls / rows * 1e6


def write_tf_project(folder: Path, api: str, model_dir: Path, features: int, processes: int, batching: bool) -> Path:
    """A TensorFlow API over the SavedModel at `model_dir` (version 1), Cortex's one-payload predictor."""
    (folder / "models").mkdir(parents=True)
    shutil.copytree(model_dir, folder / "models" / "1")
    (folder / "predictor.py").write_text(TF_PREDICTOR)
    predictor = {"type": "tensorflow", "path": "predictor.py", "models": {"path": "models/"},
                 "config": {"features": features}, "env": TF_ONE_THREAD,
                 "processes_per_replica": processes, "threads_per_process": 1}
    if batching:
        predictor.update(threads_per_process=32, server_side_batching={"max_batch_size": 32, "batch_interval": 0.01})
    (folder / "cortex.yaml").write_text(yaml.safe_dump([{"name": api, "kind": "RealtimeAPI", "predictor": predictor}]))
    return folder / "cortex.yaml"


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

    from foundation.replica_directory import RedisReplicaDirectory

    [replica] = RedisReplicaDirectory(redis.Redis.from_url(stack_redis_url)).routable(time.time(), api)
    return f"http://{replica.address}/{api}"


def wait_proxy_settled(stack_redis_url: str, apis: list[str], timeout: float = 60.0) -> None:
    """Until every proxy routes every replica of `apis` and runs one haproxy worker: a reload
    during a run (a replica becoming routable just after it answered ready) would be measured."""
    import redis

    from foundation.proxy_registry import RedisProxyRegistry, routed_everywhere
    from foundation.replica_directory import RedisReplicaDirectory

    client = redis.Redis.from_url(stack_redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.time()
        wanted = {r.replica_id for api in apis for r in RedisReplicaDirectory(client).routable(now, api)}
        if wanted and routed_everywhere(RedisProxyRegistry(client).live(now), wanted):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the proxy did not settle on the replicas of {', '.join(apis)} within {timeout:.0f}s")


def print_row(model: str, concurrency: int, label: str, f: Figures, base: Figures) -> None:
    print(f"{model:>8} {concurrency:>4} {label:<26} {f.rps:>9,.0f} {f.p50_ms:>7.2f} {f.p99_ms:>7.2f} "
          f"{f.errors:>4} {f.rps / base.rps:>11.2f} {f.p50_ms - base.p50_ms:>+9.2f} {f.cpu_us:>10,.0f}")


def bench_tensorflow(client: Client, stack: Stack, tmp: Path, processes: int, concurrency: int, duration: float,
                     row: list[float]) -> None:
    """(g) against (h): one SavedModel API served without and with server_side_batching, through the proxy.

    The predictor is Cortex's, unchanged by batching (one payload per `predict`); with batching
    the replica gathers its `tensorflow_client.predict` calls. Ratios in this part are to (g).
    """
    model_dir = tmp / "tf-mlp-savedmodel"
    save_tf_mlp(model_dir)
    features = len(row)
    body = json.dumps({f"f{i}": v for i, v in enumerate(row)})
    runs = {"(g) sluice tf via proxy": "tf-mlp-rt", "(h) sluice tf, batching 32": "tf-mlp-rt-batched"}
    try:
        for label, api in runs.items():
            client.deploy(write_tf_project(tmp / api, api, model_dir, features, processes, batching="(h)" in label))
        answers = []
        for api in runs.values():
            client.wait_ready(api, timeout=240)
            wait_http(f"{stack.url}/{api}", body)
            answers.append(requests.post(f"{stack.url}/{api}", data=body, timeout=30,
                                         headers={"Content-Type": "application/json"}).json())
        if not np.allclose(answers[0], answers[1], rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"the batched API answered {answers[1]}, the unbatched one {answers[0]}")
        wait_proxy_settled(stack.redis_url, list(runs.values()))
        figures: dict[str, Figures] = {}
        batches = (0.0, 0.0)
        for label, api in runs.items():
            url = f"{stack.url}/{api}"
            wrk(url, body, concurrency, min(2.0, duration), tmp)  # warm up
            before = batch_size_totals(stack.url, api)
            figures[label] = wrk(url, body, concurrency, duration, tmp)
            if label.startswith("(h)"):
                time.sleep(2.5)  # replicas add their figures to Redis about once a second
                after = batch_size_totals(stack.url, api)
                batches = (after[0] - before[0], after[1] - before[1])
        g, h = figures["(g) sluice tf via proxy"], figures["(h) sluice tf, batching 32"]
        print(f"{'':>8} {'':>4} tf-mlp: the mlp as a TensorFlow SavedModel, Cortex's TensorFlowPredictor; "
              f"ratios to (g)")
        for label, f in figures.items():
            print_row("tf-mlp", concurrency, label, f, g)
        mean = batches[0] / batches[1] if batches[1] else float("nan")
        one, many = tf_us_per_row(model_dir, features, 1), tf_us_per_row(model_dir, features, 32)
        print(f"{'':>8} {'':>4} (h) / (g) req/s: {h.rps / g.rps:.2f} (mean calls per model run {mean:.1f}); "
              f"CPU per request: (g) {g.cpu_us:,.0f} us, (h) {h.cpu_us:,.0f} us; the model takes {one:,.0f} us "
              f"for one row, {many:,.0f} us per row in runs of 32")
        sys.stdout.flush()
    finally:
        for api in runs.values():
            try:
                client.delete_api(api)
            except Exception as e:  # noqa: BLE001 - the stack goes away with the bench anyway
                print(f"note: deleting {api} failed: {e}")


def main() -> None:  # noqa: C901 - one flat script: the options, then each measurement in turn
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--models", default="iris,mlp,mlp-wide,tf-mlp")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install -y wrk; `make bench` does it)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sluice-realtime-bench-"))
    stack = None
    servers: list[subprocess.Popen] = []
    servers_for_run: list[subprocess.Popen] = []
    rng = np.random.default_rng(0)
    env_one_thread = {"OMP_NUM_THREADS": "1"}
    try:
        stack = Stack(port=free_port(), workers=0, queues=("cpu",), worker_loglevel="WARNING",
                      env=env_one_thread, data_dir=tmp / "stack").start()
        client = Client(stack.url)
        tls = make_self_signed(tmp / "tls", ["127.0.0.1"])
        tls_port = free_port()
        servers_for_run = [spawn([sys.executable, "-m", "sluice.cli", "proxy", "--port", str(tls_port),
                                  "--management", stack.management_url.removeprefix("http://"),
                                  "--state-dir", str(tmp / "tls-proxy"), "--tls-cert", str(tls.cert),
                                  "--tls-key", str(tls.key)],
                                 {"SLUICE_REDIS_URL": stack.redis_url or ""}, ROOT, tmp / "tls-proxy.log")]
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"https://127.0.0.1:{tls_port}/healthz", verify=str(tls.ca), timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the TLS proxy did not answer: {(tmp / 'tls-proxy.log').read_text()[-2000:]}")
            time.sleep(0.2)
        have_bento = (BENTO_VENV / "bin" / "bentoml").exists()
        if not have_bento:
            print(f"note: BentoML not installed in {BENTO_VENV} (`make bench` makes it): (d) skipped\n")
        print(f"{args.processes} processes per system, 1 thread each; wrk 1 thread, {args.duration:g} s per run\n")
        print(f"{'model':>8} {'conc':>4} {'system':<26} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'err':>4} {'x (a) req/s':>11} {'p50 - (a)':>9} {'cpu/req us':>10}")
        for name in args.models.split(","):
            if name == "tf-mlp":
                bench_tensorflow(client, stack, tmp, args.processes, max(concurrencies), args.duration,
                                 rng.standard_normal(32).round(4).tolist())
                continue
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
            systems["(b tls) via proxy, TLS"] = f"https://127.0.0.1:{tls_port}/{api}"
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
                wait_http(url, bodies[label], tmp / f"{'bento' if 'bentoml' in label else 'baseline'}-{name}.log",
                          verify=str(tls.ca) if url.startswith("https:") else True)
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
                    print_row(name, concurrency, label, f, base)
                b = figures["(b) sluice via proxy"]
                alone = figures["(c) sluice replica"]
                print(f"{'':>8} {'':>4} the hop, (b) / (c) req/s: {b.rps / alone.rps:.2f}, "
                      f"p50 {b.p50_ms - alone.p50_ms:+.2f} ms, CPU per request {b.cpu_us - alone.cpu_us:+,.0f} us")
                secure = figures["(b tls) via proxy, TLS"]
                print(f"{'':>8} {'':>4} (b tls) / (b) req/s: {secure.rps / b.rps:.2f}, "
                      f"p50 {secure.p50_ms - b.p50_ms:+.2f} ms, CPU per request {secure.cpu_us - b.cpu_us:+,.0f} us")
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
        for process in servers + servers_for_run:
            stop(process)
        if stack is not None:
            stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
