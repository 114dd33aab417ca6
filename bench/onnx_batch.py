"""ONNX batch inference: Sluice against a plain onnxruntime loop and Ray Data (`make bench`).

The same rows go through the same ONNX models in three systems, each using two processes:
- models, made here into a temp folder: `iris`, sklearn's LogisticRegression on the bundled iris
  data exported with skl2onnx (zipmap off; 4 features), and `mlp`, a ~1.1M-parameter
  32 -> 1024 -> 1024 -> 10 Relu network built with `onnx.helper` (fixed-seed float32 weights).
- rows: JSON objects as users submit them ({"f0": 5.1, "f1": ...}), written once to a
  JSON-lines file per model (`--rows`, or `--iris-rows` / `--mlp-rows`).
- (a) loop: a multiprocessing Pool of 2; each process reads its half of the file (byte ranges cut
  at line ends), parses the JSON, builds a float32 array per batch and runs its session. The
  baseline: the same work with nothing in between. Time: the pool call, sessions built inside.
- (b) Sluice: the embedded stack with 2 worker nodes runs an ONNX project (predictor turns the
  payload dicts into a float32 array and calls `onnx_client.predict`, returns nothing) on a
  `delimited_files` job of the file. Time: the job's server-side `start_time` (submission, so the
  API's validation pass is in it) to `end_time`; "enq s" is when polling first saw it running.
- (c) Ray Data: `ray.init(num_cpus=2)`, `read_json` then `map_batches` with a callable class
  building its session once (`concurrency=2`, numpy batches), consumed by iterating. Time: the
  whole pipeline, from `read_json` to the last batch.
Every ONNX session has one intra-op thread (Sluice's workers get `OMP_NUM_THREADS=1`), so the
processes do not fight over two cores. Each system is warmed up once with a small run first.
Figures are rows/s, the median of `--repeat` runs, with ratios Sluice/loop and Sluice/Ray.
Run: `python bench/onnx_batch.py [--rows N] [--batch-sizes 256,1000] [--repeat R]`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

PROCESSES = 2
WARMUP_ROWS = 2000
PREDICTOR = '''
import numpy as np


class ONNXPredictor:
    def __init__(self, onnx_client, config, job_spec):
        self.client = onnx_client
        self.names = [f"f{i}" for i in range(config["features"])]

    def predict(self, payload, batch_id):
        names = self.names
        self.client.predict(np.array([[item[n] for n in names] for item in payload], dtype=np.float32))
'''
CORTEX_YAML = """- name: {name}-bench
  kind: BatchAPI
  predictor:
    type: onnx
    path: predictor.py
    models:
      path: models/{name}/
    config:
      features: {features}
  compute:
    cpu: 1
"""


# -- models and rows ------------------------------------------------------------------------------
def iris_model() -> tuple[bytes, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris()
    features = iris.data.astype(np.float32)
    model = LogisticRegression(max_iter=1000).fit(features, iris.target)
    onnx_model = to_onnx(model, features[:1], options={id(model): {"zipmap": False}})
    return onnx_model.SerializeToString(), features


def mlp_model(sizes=(32, 1024, 1024, 10), seed: int = 0) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights, current = [], [], "X"
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(np.zeros(n_out, np.float32), f"B{i}")]
        last = i == len(sizes) - 2
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], ["Y" if last else f"H{i}"]))
        if not last:
            nodes.append(helper.make_node("Relu", [f"H{i}"], [f"R{i}"]))
            current = f"R{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", sizes[-1]])], initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def write_rows(path: Path, values: np.ndarray) -> None:
    with open(path, "w") as f:
        for row in values.tolist():
            f.write(json.dumps({f"f{i}": v for i, v in enumerate(row)}) + "\n")


def session(model_path: str):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


# -- (a) the plain loop ---------------------------------------------------------------------------
def loop_share(args: tuple[str, str, int, int, int, int]) -> int:
    """Rows of the file in [start, end) (lines starting there), parsed and run in batches."""
    model_path, data_path, start, end, batch_size, features = args
    sess, names, rows = session(model_path), [f"f{i}" for i in range(features)], 0
    input_name = sess.get_inputs()[0].name
    with open(data_path, "rb") as f:
        if start:
            f.seek(start - 1)
            f.readline()  # finish the line that started before this share
        batch: list = []
        while f.tell() < end and (line := f.readline()):
            batch.append(json.loads(line))
            if len(batch) == batch_size or f.tell() >= end:
                sess.run(None, {input_name: np.array([[r[n] for n in names] for r in batch], dtype=np.float32)})
                rows, batch = rows + len(batch), []
    if batch:
        sess.run(None, {input_name: np.array([[r[n] for n in names] for r in batch], dtype=np.float32)})
        rows += len(batch)
    return rows


def run_loop(pool, model_path: str, data_path: Path, batch_size: int, features: int, rows: int) -> float:
    size = data_path.stat().st_size
    cuts = [size * i // PROCESSES for i in range(PROCESSES + 1)]
    started = time.perf_counter()
    done = sum(pool.map(loop_share, [(model_path, str(data_path), a, b, batch_size, features)
                                     for a, b in zip(cuts, cuts[1:])]))
    elapsed = time.perf_counter() - started
    assert done == rows, (done, rows)
    return elapsed


# -- (b) Sluice -----------------------------------------------------------------------------------
def run_sluice(client: Client, api: str, data_path: Path, batch_size: int, rows: int) -> tuple[float, float]:
    body = {"workers": PROCESSES, "delimited_files": {"s3_paths": [str(data_path)], "batch_size": batch_size}}
    job_id = client.submit_raw(api, body)["job_id"]
    running_at = None
    while (status := client.job(api, job_id))["status"] in ("status_enqueuing", "status_running"):
        if running_at is None and status["status"] == "status_running":
            running_at = time.time()
        time.sleep(0.05)
    assert status["status"] == "status_succeeded", status
    assert status["batch_metrics"]["succeeded"] == -(-rows // batch_size), status["batch_metrics"]
    epoch = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()  # noqa: E731
    start, end = epoch(status["start_time"]), epoch(status["end_time"])
    return end - start, (running_at or end) - start


# -- (c) Ray Data ---------------------------------------------------------------------------------
class RayOnnx:
    def __init__(self, model_path: str, features: int) -> None:
        self.session = session(model_path)
        self.input_name = self.session.get_inputs()[0].name
        self.names = [f"f{i}" for i in range(features)]

    def __call__(self, batch: dict) -> dict:
        x = np.stack([batch[n] for n in self.names], axis=1).astype(np.float32)
        self.session.run(None, {self.input_name: x})
        return {"rows": np.array([len(x)])}


def run_ray(model_path: str, data_path: Path, batch_size: int, features: int, rows: int) -> float:
    import ray

    started = time.perf_counter()
    ds = ray.data.read_json(str(data_path)).map_batches(
        RayOnnx, fn_constructor_kwargs={"model_path": model_path, "features": features},
        batch_size=batch_size, concurrency=PROCESSES, batch_format="numpy",
    )
    done = sum(int(b["rows"].sum()) for b in ds.iter_batches(batch_format="numpy", batch_size=None))
    elapsed = time.perf_counter() - started
    assert done == rows, (done, rows)
    return elapsed


# -- main -----------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, help="rows for every model (overrides the two below)")
    parser.add_argument("--iris-rows", type=int, default=200_000)
    parser.add_argument("--mlp-rows", type=int, default=50_000)
    parser.add_argument("--models", default="iris,mlp")
    parser.add_argument("--batch-sizes", default="256,1000")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure; the median is shown")
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sluice-onnx-bench-"))
    pool, ray_started, stack = None, False, None
    try:
        rng = np.random.default_rng(0)
        iris_bytes, iris_x = iris_model()
        makers = {
            "iris": (lambda: iris_bytes, lambda n: iris_x[rng.integers(0, len(iris_x), n)].round(1), 4, args.iris_rows),
            "mlp": (mlp_model, lambda n: rng.standard_normal((n, 32)).round(4), 32, args.mlp_rows),
        }
        models = {}
        for name in args.models.split(","):
            make_model, make_rows, features, rows = makers[name]
            rows = args.rows or rows
            project = tmp / f"{name}-project"
            model_path = project / "models" / name / "1" / "model.onnx"
            model_path.parent.mkdir(parents=True)
            model_path.write_bytes(make_model())
            (project / "predictor.py").write_text(PREDICTOR)
            (project / "cortex.yaml").write_text(CORTEX_YAML.format(name=name, features=features))
            data, warm = tmp / f"{name}.jsonl", tmp / f"{name}-warmup.jsonl"
            write_rows(data, make_rows(rows))
            write_rows(warm, make_rows(WARMUP_ROWS))
            models[name] = dict(project=project, model=str(model_path), data=data, warm=warm, features=features, rows=rows)

        pool = multiprocessing.get_context("spawn").Pool(PROCESSES)
        import ray

        ray.init(num_cpus=PROCESSES, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        ray_started = True
        stack = Stack(port=free_port(), workers=PROCESSES, queues=("cpu",), worker_loglevel="WARNING",
                      env={"OMP_NUM_THREADS": "1", "SLUICE_LOCAL_INPUT_ROOTS": str(tmp)}).start()
        client = Client(stack.url)
        for name, m in models.items():  # warm up: imports, worker processes, first sessions
            client.deploy(m["project"] / "cortex.yaml")
            run_loop(pool, m["model"], m["warm"], 256, m["features"], WARMUP_ROWS)
            run_sluice(client, f"{name}-bench", m["warm"], 256, WARMUP_ROWS)
            run_ray(m["model"], m["warm"], 256, m["features"], WARMUP_ROWS)

        print(f"{PROCESSES} processes per system, one ONNX thread each, rows/s (median of {args.repeat})\n")
        print(f"{'model':>5} {'rows':>8} {'batch':>6} {'loop':>9} {'sluice':>9} {'ray':>9} "
              f"{'sluice/loop':>12} {'sluice/ray':>11} {'enq s':>6}")
        for name, m in models.items():
            for batch_size in batch_sizes:
                loop_runs, sluice_runs, enqueue_runs, ray_runs = [], [], [], []
                for _ in range(args.repeat):  # interleaved, so drift on the machine hits all alike
                    loop_runs.append(run_loop(pool, m["model"], m["data"], batch_size, m["features"], m["rows"]))
                    total, enqueue = run_sluice(client, f"{name}-bench", m["data"], batch_size, m["rows"])
                    sluice_runs.append(total)
                    enqueue_runs.append(enqueue)
                    ray_runs.append(run_ray(m["model"], m["data"], batch_size, m["features"], m["rows"]))
                loop_s, sluice_s, ray_s, enqueue_s = (
                    statistics.median(r) for r in (loop_runs, sluice_runs, ray_runs, enqueue_runs))
                rate = lambda s: m["rows"] / s  # noqa: E731
                print(f"{name:>5} {m['rows']:>8} {batch_size:>6} {rate(loop_s):>9,.0f} {rate(sluice_s):>9,.0f} "
                      f"{rate(ray_s):>9,.0f} {loop_s / sluice_s:>12.2f} {ray_s / sluice_s:>11.2f} {enqueue_s:>6.2f}")
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        if ray_started:
            import ray

            ray.shutdown()
        if stack is not None:
            stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
