"""AsyncAPI requests: Sluice against plain Celery with the same ONNX model (`make bench`).

`--requests` (2,000) single rows are submitted as fast as `--clients` threads can, to:
- Sluice: an AsyncAPI (an ONNX predictor running one row per request) on the embedded stack with
  2 worker nodes; each `POST /<name>` goes through the proxy and the management API, is stored in
  Redis and queued as one Celery task. Times are the server's own: each request's `created` (the
  API stored it) and `timestamp` (its node recorded the outcome), read from its record in Redis.
- plain Celery: `task.delay(row)` with the same model (a session per process), 2 worker processes,
  results in the same Redis, then `AsyncResult.get()` for each; from the client's clock at `delay`
  to the worker's clock when the row was done.
Models: iris (4 features) and the ~1.1M-parameter MLP of `bench/onnx_batch.py`; `mlp+batching` is
the MLP's AsyncAPI with `server_side_batching` (up to 32 queued requests in one `predict`) against
the same one-row Celery task. Figures:
completed requests/s (requests / (last outcome - first submission)), p50 and p99 seconds from
submission to outcome, and Sluice/Celery ratios (throughput: above 1 Sluice is faster; latency:
below 1 Sluice is faster), and the machine's busy CPU per request over each run (/proc/stat: the
client, proxy, API, Redis and workers alike share its cores), which varies much less from run to
run than requests/s does: the figure to compare two commits by. Median of `--repeat` runs.
Ray Serve's asynchronous inference (a `@task_consumer` on Celery and Redis, `bench/ray_async_serve.py`)
is measured where its virtual environment is (`bench/.venv-ray`, from `bench/requirements-ray.lock`;
`make bench` makes it), after the table above, on the same rows with the same number of processes:
its own table compares Sluice's figures above with it.
Run: `python bench/async_api.py [--requests N] [--models iris,mlp,mlp+batching] [--repeat R]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import urllib3  # noqa: E402

from bench.onnx_batch import iris_model, mlp_model  # noqa: E402
from bench.realtime import busy_cpu_seconds  # noqa: E402
from jobs.asyncapi.request import RequestStatus  # noqa: E402
from jobs.asyncapi.store import RedisAsyncRequests  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

PROCESSES = 2
WARMUP_REQUESTS = 100
SETTLE_S = 1.0
PREDICTOR = '''import numpy as np


class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client, self.names = onnx_client, [f"f{i}" for i in range(config["features"])]

    def predict(self, payload, request_id):
        [out, *_] = self.client.predict(np.array([[payload[n] for n in self.names]], dtype=np.float32))
        return out[0].tolist()
'''
# With server_side_batching, predict gets the lists of the requests a node gathered into one run.
BATCHED_PREDICTOR = '''import numpy as np


class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client, self.names = onnx_client, [f"f{i}" for i in range(config["features"])]

    def predict(self, payload, request_id):
        rows = np.array([[p[n] for n in self.names] for p in payload], dtype=np.float32)
        [out, *_] = self.client.predict(rows)
        return out.tolist()
'''
# Both worker nodes serve it (`min_replicas`), as both plain Celery processes serve the baseline.
CORTEX_YAML = ("- name: {api}\n  kind: AsyncAPI\n  autoscaling: {{min_replicas: 2}}\n  predictor:\n    type: onnx\n"
               "    path: predictor.py\n    models: {{path: models/{model}/}}\n    config: {{features: {features}}}\n"
               "{batching}")
BATCHING = "    server_side_batching: {max_batch_size: 32, batch_interval: 0.01}\n"


def prepare(tmp: Path, name: str, rng: np.random.Generator, count: int) -> dict:
    """The model's AsyncAPI project and `count` rows as JSON objects ({"f0": 5.1, ...}); a name ending
    in "+batching" deploys the model with server_side_batching (the plain Celery baseline stays one row
    a task)."""
    model_name = name.removesuffix("+batching")
    batched = model_name != name
    if model_name == "iris":
        model_bytes, iris_x = iris_model()
        features, values = 4, iris_x[rng.integers(0, len(iris_x), count)].round(1)
    else:
        model_bytes, features, values = mlp_model(), 32, rng.standard_normal((count, 32)).round(4)
    api = f"{model_name}-async" + ("-batched" if batched else "")
    project = tmp / f"{api}-project"
    model_path = project / "models" / model_name / "1" / "model.onnx"
    model_path.parent.mkdir(parents=True)
    model_path.write_bytes(model_bytes)
    (project / "predictor.py").write_text(BATCHED_PREDICTOR if batched else PREDICTOR)
    (project / "cortex.yaml").write_text(CORTEX_YAML.format(api=api, model=model_name, features=features,
                                                            batching=BATCHING if batched else ""))
    rows = [{f"f{i}": v for i, v in enumerate(row)} for row in values.tolist()]
    return {"api": api, "project": project, "model": str(model_path), "features": features, "rows": rows}


def figures(run: tuple[list[tuple[float, float]], float]) -> tuple[float, float, float, float]:
    """(requests/s, p50 s, p99 s, busy CPU us per request) of a run's (submitted, done) pairs and the
    machine's busy CPU seconds over it."""
    spans, busy = run
    durations = sorted(done - submitted for submitted, done in spans)
    elapsed = max(done for _, done in spans) - min(submitted for submitted, _ in spans)
    p99 = durations[min(len(durations) - 1, round(0.99 * (len(durations) - 1)))]
    return len(spans) / elapsed, statistics.median(durations), p99, busy / len(spans) * 1e6


def run_sluice(url: str, store: RedisAsyncRequests, api: str, rows: list[dict],
               clients: int) -> tuple[list[tuple[float, float]], float]:
    """Submit every row from `clients` threads (keep-alive connections of urllib3, the HTTP engine
    under `requests`, without its per-call work), wait for every outcome, and return each request's
    (created, timestamp) as the server recorded them, and the machine's busy CPU seconds from the
    first submission to the last outcome."""
    http = urllib3.PoolManager(maxsize=clients, timeout=60.0, retries=False)

    def submit(row: dict) -> str:
        answer = http.request("POST", f"{url}/{api}", body=json.dumps(row).encode(),
                              headers={"Content-Type": "application/json"})
        if answer.status != 200:
            raise RuntimeError(f"POST /{api}: {answer.status} {answer.data[:200]!r}")
        return json.loads(answer.data)["id"]

    busy = busy_cpu_seconds()
    with ThreadPoolExecutor(clients) as pool:
        ids = list(pool.map(submit, rows))
    deadline = time.monotonic() + 600
    while (counts := store.counts(api, time.time())).in_queue + counts.in_progress:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{api}: {counts} still open after 600 s")
        time.sleep(0.05)
    busy = busy_cpu_seconds() - busy
    spans = []
    for request_id in ids:
        record = store.get(api, request_id)
        assert record is not None and record.status is RequestStatus.COMPLETED, record
        assert record.timestamp is not None
        spans.append((record.created, record.timestamp))
    return spans, busy


def run_celery(model: dict, rows: list[dict], clients: int) -> tuple[list[tuple[float, float]], float]:
    """`task.delay(row)` from `clients` threads, then `AsyncResult.get()` for each: (sent, done), and the
    machine's busy CPU seconds from the first `delay` to the last result."""
    from bench.plain_celery_app import onnx_row

    names = [f"f{i}" for i in range(model["features"])]

    def send(row: dict) -> tuple[float, object]:
        sent = time.time()
        return sent, onnx_row.delay(model["model"], names, row)

    busy = busy_cpu_seconds()
    with ThreadPoolExecutor(clients) as pool:
        pending = list(pool.map(send, rows))
    spans = []
    for sent, result in pending:
        answer = result.get(timeout=600)
        spans.append((sent, answer["done"]))
    busy = busy_cpu_seconds() - busy
    for _, result in pending:
        result.forget()
    return spans, busy


RAY_PYTHON = ROOT / "bench" / ".venv-ray" / "bin" / "python"
RAY_REDIS_DB = 5  # apart from the stack's (0) keys


def run_ray(redis_url: str, model: dict, tmp: Path, runs: int, clients: int) -> list[list[tuple[float, float]]]:
    """`runs` runs of Ray Serve's asynchronous inference on the model's rows (`bench/ray_async_serve.py`,
    in its own environment): each run's (enqueued, done) pairs."""
    rows = tmp / f"ray-rows-{model['api']}.json"
    rows.write_text(json.dumps(model["rows"]))
    url = redis_url.rsplit("/", 1)[0] + f"/{RAY_REDIS_DB}"
    done = subprocess.run(
        [str(RAY_PYTHON), str(ROOT / "bench" / "ray_async_serve.py"), "--redis", url, "--model", model["model"],
         "--features", str(model["features"]), "--rows", str(rows), "--runs", str(runs), "--clients", str(clients),
         "--processes", str(PROCESSES)],
        capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench/ray_async_serve.py exited {done.returncode}: {done.stderr[-2000:]}")
    return [[tuple(span) for span in json.loads(line)] for line in done.stdout.splitlines() if line.startswith("[")]


def ray_table(redis_url: str, models: dict[str, dict], sluice: dict[str, tuple[float, float, float]], tmp: Path,
              runs: int, clients: int) -> None:
    """Ray Serve's figures per model (one row a task, as plain Celery), against Sluice's from the table above."""
    if not RAY_PYTHON.exists():
        print("\nRay Serve: bench/.venv-ray is missing (`make bench` makes it from bench/requirements-ray.lock); "
              "skipped")
        return
    print(f"\nRay Serve asynchronous inference ({PROCESSES} task-consumer replicas, one task at a time each; "
          "tasks enqueued through its Celery adapter, no HTTP; one row a task)")
    print(f"{'model':>12} {'ray req/s':>10} {'p50':>7} {'p99':>7} {'sluice/ray req/s':>17} {'p50 ratio':>10} "
          f"{'p99 ratio':>10}")
    measured: dict[str, tuple[float, float, float]] = {}
    for name, m in models.items():
        base = name.removesuffix("+batching")
        if base not in measured:
            try:
                # The CPU of Ray's run is not measured (its processes start with the run).
                results = [figures((spans, float("nan")))[:3] for spans in run_ray(redis_url, m, tmp, runs, clients)]
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"{name:>12} failed: {e}")
                return
            rate, p50, p99 = (statistics.median(r) for r in zip(*results, strict=True))
            measured[base] = (rate, p50, p99)
        rate, p50, p99 = measured[base]
        s_rate, s_p50, s_p99 = sluice[name]
        print(f"{name:>12} {rate:>10,.0f} {p50:>7.3f} {p99:>7.3f} {s_rate / rate:>17.2f} {s_p50 / p50:>10.2f} "
              f"{s_p99 / p99:>10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--models", default="iris,mlp,mlp+batching",
                        help="+batching: the same model with server_side_batching")
    parser.add_argument("--clients", type=int, default=8, help="submitting threads, for each system")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the median is shown")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below when killed too
    tmp = Path(tempfile.mkdtemp(prefix="sluice-async-bench-"))
    stack = None
    plain_workers: list[subprocess.Popen] = []
    try:
        rng = np.random.default_rng(0)
        models = {name: prepare(tmp, name, rng, args.requests) for name in args.models.split(",")}
        stack = Stack(port=free_port(), workers=PROCESSES, queues=("cpu",), worker_loglevel="WARNING",
                      env={"OMP_NUM_THREADS": "1"}).start()
        redis_url = stack.redis_url or ""
        os.environ["SLUICE_REDIS_URL"] = redis_url  # the plain Celery app's broker and backend
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        plain_workers = [
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.plain_celery_app", "worker", "-Q", "plain",
                 "-c", "1", "-n", f"plain{n}@%h", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            for n in range(PROCESSES)
        ]
        client = Client(stack.url)
        store = RedisAsyncRequests(redis.Redis.from_url(redis_url), retention_s=3600)
        for m in models.values():  # warm up: imports, worker processes, each process's predictor and session
            client.deploy(m["project"] / "cortex.yaml")
            run_sluice(stack.url, store, m["api"], m["rows"][:WARMUP_REQUESTS], args.clients)
            run_celery(m, m["rows"][:WARMUP_REQUESTS], args.clients)

        print(f"{args.requests} requests of one row each, submitted by {args.clients} client threads; "
              f"{PROCESSES} worker processes per system; median of {args.repeat}")
        print("req/s: completed requests per second, first submission to last outcome; p50/p99: seconds "
              "from submission to outcome (server timestamps); "
              "cpu/req: the machine's busy CPU per request over the run (all of it: client, proxy, API, Redis, "
              "workers), steadier than req/s from run to run; cpu ratio below 1: Sluice spends less\n")
        print(f"{'model':>12} {'sluice req/s':>13} {'p50':>7} {'p99':>7} {'cpu/req us':>10} {'celery req/s':>13} "
              f"{'p50':>7} {'p99':>7} {'cpu/req us':>10} {'req/s ratio':>12} {'p50 ratio':>10} {'p99 ratio':>10} "
              f"{'cpu ratio':>10}")
        sluice_figures: dict[str, tuple[float, float, float]] = {}
        for name, m in models.items():
            sluice_runs, celery_runs = [], []
            for _ in range(args.repeat):  # interleaved, so drift on the machine hits both alike
                time.sleep(SETTLE_S)
                sluice_runs.append(figures(run_sluice(stack.url, store, m["api"], m["rows"], args.clients)))
                time.sleep(SETTLE_S)
                celery_runs.append(figures(run_celery(m, m["rows"], args.clients)))
            s_rate, s_p50, s_p99, s_cpu = (statistics.median(r) for r in zip(*sluice_runs, strict=True))
            c_rate, c_p50, c_p99, c_cpu = (statistics.median(r) for r in zip(*celery_runs, strict=True))
            sluice_figures[name] = (s_rate, s_p50, s_p99)
            print(f"{name:>12} {s_rate:>13,.0f} {s_p50:>7.3f} {s_p99:>7.3f} {s_cpu:>10,.0f} {c_rate:>13,.0f} "
                  f"{c_p50:>7.3f} {c_p99:>7.3f} {c_cpu:>10,.0f} {s_rate / c_rate:>12.2f} {s_p50 / c_p50:>10.2f} "
                  f"{s_p99 / c_p99:>10.2f} {s_cpu / c_cpu:>10.2f}")
        for worker in plain_workers:  # Ray's run has the machine without them
            worker.terminate()
        ray_table(redis_url, models, sluice_figures, tmp, args.repeat, args.clients)
    finally:
        for worker in plain_workers:
            worker.terminate()
        for worker in plain_workers:
            worker.wait(timeout=30)
        if stack is not None:
            stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
