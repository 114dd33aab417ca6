"""ONNX batch inference: Sluice against a plain onnxruntime loop and Ray Data (`make bench`).

The same rows through the same ONNX models, made here in a temp folder: `iris` (sklearn's
LogisticRegression on the bundled iris data, skl2onnx with zipmap off; 4 features) and `mlp`
(32 -> 1024 -> 1024 -> 10 with Relu, ~1.1M fixed-seed float32 weights, built with `onnx.helper`).
Rows are JSON objects as users submit them ({"f0": 5.1, ...}) in one JSON-lines file per model.
Each system uses two processes:
- loop (the baseline): a multiprocessing Pool of 2; each process reads its half of the file,
  parses the JSON, builds a float32 array per batch and runs its own session.
- Sluice: the embedded stack with 2 worker nodes runs a `delimited_files` job of the file on an
  ONNX project (the predictor turns payload dicts into a float32 array and calls
  `onnx_client.predict`). Time: the job's server-side `start_time` (submission, so the API's
  validation of every line is in it) to `end_time`; "enq s" is when polling saw it running.
- Ray Data: `ray.init(num_cpus=2)`, `read_json`, `map_batches` with a callable class holding one
  session (an actor pool of 2, numpy batches), consumed by iterating; actor start-up included.
  Ray runs only for its own runs (started, warmed up untimed, measured, shut down), so its idle
  daemons do not run under the other systems.
Loop and Ray sessions have one intra-op thread. Sluice's workers get `OMP_NUM_THREADS=1`, which its
`onnx_client` passes on to onnxruntime (as users running several nodes on one host should set it).
Each system is warmed up with a small run first and each run starts after a short pause. Figures:
rows/s (median of `--repeat`), and Sluice/loop and Sluice/Ray (above 1: Sluice is faster).
Run: `python bench/onnx_batch.py [--rows N] [--batch-sizes 256,1000] [--repeat R]`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import multiprocessing
import shutil
import signal
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
SETTLE_S = 3.0
PREDICTOR = '''import numpy as np


class ONNXPredictor:
    def __init__(self, onnx_client, config, job_spec):
        self.client, self.names = onnx_client, [f"f{i}" for i in range(config["features"])]

    def predict(self, payload, batch_id):
        self.client.predict(np.array([[item[n] for n in self.names] for item in payload], dtype=np.float32))
'''
CORTEX_YAML = ("- name: {name}-bench\n  kind: BatchAPI\n  predictor:\n    type: onnx\n    path: predictor.py\n"
               "    models: {{path: models/{name}/}}\n    config: {{features: {features}}}\n")


def iris_model() -> tuple[bytes, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    iris = load_iris()
    features = iris.data.astype(np.float32)
    model = LogisticRegression(max_iter=1000).fit(features, iris.target)
    onnx_model = to_onnx(model, features[:1], options={id(model): {"zipmap": False}})
    return onnx_model.SerializeToString(), iris.data  # float64 rows: JSON shows 5.1, not 5.099999904632568


def mlp_model(sizes=(32, 1024, 1024, 10), seed: int = 0) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights, current = [], [], "X"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(np.zeros(n_out, np.float32), f"B{i}")]
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], [f"H{i}"]))
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [f"H{i}"], [current := f"R{i}"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info(f"H{len(sizes) - 2}", TensorProto.FLOAT, ["N", sizes[-1]])], initializer=weights,
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
        while line := (f.readline() if f.tell() < end else b""):
            batch.append(json.loads(line))
            if len(batch) == batch_size or f.tell() >= end:
                sess.run(None, {input_name: np.array([[r[n] for n in names] for r in batch], dtype=np.float32)})
                rows, batch = rows + len(batch), []
    return rows


def run_loop(pool, model_path: str, data_path: Path, batch_size: int, features: int, rows: int) -> float:
    size = data_path.stat().st_size
    cuts = [size * i // PROCESSES for i in range(PROCESSES + 1)]
    started = time.perf_counter()
    done = sum(pool.map(loop_share, [(model_path, str(data_path), a, b, batch_size, features)
                                     for a, b in itertools.pairwise(cuts)]))
    assert done == rows, (done, rows)
    return time.perf_counter() - started


def run_sluice(client: Client, api: str, data_path: Path, batch_size: int, rows: int) -> tuple[float, float]:
    body = {"workers": PROCESSES, "delimited_files": {"s3_paths": [str(data_path)], "batch_size": batch_size}}
    job_id = client.submit_raw(api, body)["job_id"]
    running_at = None
    while (status := client.job(api, job_id))["status"] in ("status_enqueuing", "status_running"):
        if running_at is None and status["status"] == "status_running":
            running_at = time.time()
        time.sleep(0.1)
    assert status["status"] == "status_succeeded", status
    assert status["batch_metrics"]["succeeded"] == -(-rows // batch_size), status["batch_metrics"]
    start, end = (datetime.fromisoformat(status[k].replace("Z", "+00:00")).timestamp()
                  for k in ("start_time", "end_time"))
    return end - start, (running_at or end) - start


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
        # Half a logical CPU per actor: at one each, the two actors hold both CPUs and the read
        # task is never scheduled (a deadlock seen with ray.init(num_cpus=2)).
        batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=PROCESSES), num_cpus=0.5, batch_format="numpy")
    done = sum(int(b["rows"].sum()) for b in ds.iter_batches(batch_format="numpy", batch_size=None))
    assert done == rows, (done, rows)
    return time.perf_counter() - started


def ray_started() -> None:
    import ray

    ray.init(num_cpus=PROCESSES, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)


def run_ray_alone(model_path: str, data_path: Path, warm_path: Path, batch_size: int, features: int,
                  rows: int) -> float:
    """Ray started for this run only, warmed up on the small file first (untimed), then shut down.

    Idle, Ray's daemons keep 3-5% of the two cores busy (measured), and more after many runs:
    left running, they slowed the other systems' runs (Sluice's MLP by up to 9%).
    """
    import ray

    ray_started()
    try:
        run_ray(model_path, warm_path, batch_size, features, WARMUP_ROWS)
        time.sleep(SETTLE_S)  # the warm-up pipeline's own wind-down
        return run_ray(model_path, data_path, batch_size, features, rows)
    finally:
        ray.shutdown()


def prepare(tmp: Path, name: str, rows: int, rng: np.random.Generator) -> dict:
    """The model's project folder (model, predictor, cortex.yaml) and its JSON-lines files."""
    if name == "iris":
        model_bytes, iris_x = iris_model()
        features, make_rows = 4, lambda n: iris_x[rng.integers(0, len(iris_x), n)].round(1)
    else:
        model_bytes, features, make_rows = mlp_model(), 32, lambda n: rng.standard_normal((n, 32)).round(4)
    project = tmp / f"{name}-project"
    model_path = project / "models" / name / "1" / "model.onnx"
    model_path.parent.mkdir(parents=True)
    model_path.write_bytes(model_bytes)
    (project / "predictor.py").write_text(PREDICTOR)
    (project / "cortex.yaml").write_text(CORTEX_YAML.format(name=name, features=features))
    write_rows(data := tmp / f"{name}.jsonl", make_rows(rows))
    write_rows(warm := tmp / f"{name}-warmup.jsonl", make_rows(WARMUP_ROWS))
    return {"api": f"{name}-bench", "project": project, "model": str(model_path), "data": data, "warm": warm,
                "features": features, "rows": rows}


def settled(run, *args):
    """`run(*args)` after a pause: a Ray pipeline keeps 1-2 cores busy for ~2 s after it ends."""
    time.sleep(SETTLE_S)
    return run(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, help="rows for every model (else the two below)")
    parser.add_argument("--iris-rows", type=int, default=200_000)
    parser.add_argument("--mlp-rows", type=int, default=50_000)
    parser.add_argument("--models", default="iris,mlp")
    parser.add_argument("--batch-sizes", default="256,1000")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below when killed too
    tmp = Path(tempfile.mkdtemp(prefix="sluice-onnx-bench-"))
    pool = stack = None
    try:
        rng = np.random.default_rng(0)
        models = {name: prepare(tmp, name, args.rows or getattr(args, f"{name}_rows"), rng)
                  for name in args.models.split(",")}
        pool = multiprocessing.get_context("spawn").Pool(PROCESSES)
        stack = Stack(port=free_port(), workers=PROCESSES, queues=("cpu",), worker_loglevel="WARNING",
                      env={"OMP_NUM_THREADS": "1", "SLUICE_LOCAL_INPUT_ROOTS": str(tmp)}).start()
        client = Client(stack.url)
        for m in models.values():  # warm up: imports, worker processes, first sessions
            client.deploy(m["project"] / "cortex.yaml")
            run_loop(pool, m["model"], m["warm"], 256, m["features"], WARMUP_ROWS)
            run_sluice(client, m["api"], m["warm"], 256, WARMUP_ROWS)

        print(f"{PROCESSES} processes per system; rows/s, median of {args.repeat}; "
              "enq s: Sluice's submission to all batches queued\n")
        print(f"{'model':>5} {'rows':>8} {'batch':>6} {'loop':>9} {'sluice':>9} {'ray':>9} "
              f"{'sluice/loop':>12} {'sluice/ray':>11} {'enq s':>6}")
        for name, m in models.items():
            for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
                runs = [(settled(run_loop, pool, m["model"], m["data"], batch_size, m["features"], m["rows"]),
                         *settled(run_sluice, client, m["api"], m["data"], batch_size, m["rows"]),
                         settled(run_ray_alone, m["model"], m["data"], m["warm"], batch_size, m["features"], m["rows"]))
                        for _ in range(args.repeat)]  # interleaved, so drift on the machine hits all alike
                loop_s, sluice_s, enqueue_s, ray_s = (statistics.median(r) for r in zip(*runs, strict=False))
                rate = lambda s, rows=m["rows"]: rows / s  # noqa: E731
                print(f"{name:>5} {m['rows']:>8} {batch_size:>6} {rate(loop_s):>9,.0f} {rate(sluice_s):>9,.0f} "
                      f"{rate(ray_s):>9,.0f} {loop_s / sluice_s:>12.2f} {ray_s / sluice_s:>11.2f} {enqueue_s:>6.2f}")
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        if stack is not None:
            stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
