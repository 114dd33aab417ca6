"""Sluice's GPU paths on a GPU host, checked in one run (`bash bench/gpu_check.sh` from the checkout).

The CI machines have no GPU, so what runs only with one is checked here, on a host that has it:
(a) what the host offers: onnxruntime's version and execution providers, `nvidia-smi -L`, torch's
    view of CUDA, TensorFlow (absent: its GPU path is then not checked);
(b) Sluice's own ONNX client, made from a cortex.yaml with `compute: {gpu: 1}` as workers make it
    (`predictors_runtime.builder.make_client`), on a small MLP built here (32 -> 1024 -> 1024 -> 10,
    as bench/onnx_batch.py's): the providers its session really uses, and the time of one
    `predict` of 256 rows on the GPU provider and on the CPU provider (the same config with
    `compute: {cpu: 1}`), both measured in this run;
(c) the normal batch path end to end: a private redis-server (the first on PATH), the management
    API under gunicorn, beat and one real `celery -A jobs worker -Q gpu` node (sluice/embedded.py's
    Stack, without the proxy and realtime replicas, which a batch job does not use); the same
    project deployed as a BatchAPI, a job of 1,024 rows in batches of 256, and checks that it
    succeeded, that the API's queue is `gpu`, which providers the node's session used (the rows
    the predictor writes, and the node's log line at model load) and that its outputs match a
    CPU session's;
(d) on the same node, a Cortex PythonPredictor (compute: {gpu: 1}) that brings its own framework,
    torch: the job succeeds, its rows name the GPU the predictor ran on, and match a CPU product;
(e) one summary table.
Each part that cannot run says SKIP and why, so a CPU-only onnxruntime still gives a full report.
Every result is printed as it comes, so a run cut short still shows what it found. With the OUT
environment variable set, the summary (gpu_check.json) and the worker node's log are written there.
Exit status: 1 if any check failed, else 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
FEATURES = 32
LAYERS = (FEATURES, 1024, 1024, 10)
API_NAME = "gpu-check"
LOG_TAIL_BYTES = 200_000  # of each log copied to OUT
PREDICTOR = '''import os

import numpy as np


class ONNXPredictor:
    def __init__(self, onnx_client, config):
        self.client = onnx_client
        # What this node's session really runs on, written into every row.
        self.providers = onnx_client.get_model()["session"].get_providers()

    def predict(self, payload, batch_id):
        (scores,) = self.client.predict(np.array(payload, dtype=np.float32))
        return [{"providers": self.providers, "pid": os.getpid(), "scores": row.tolist()} for row in scores]
'''
TORCH_API_NAME = "gpu-check-torch"
# A Cortex PythonPredictor that brings its own framework: torch on the GPU the node was given.
TORCH_PREDICTOR = '''import os

import torch


class PythonPredictor:
    def __init__(self, config, job_spec):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        generator = torch.Generator().manual_seed(0)
        self.weights = torch.randn(32, 10, generator=generator).to(self.device)

    def predict(self, payload, batch_id):
        scores = torch.tensor(payload, dtype=torch.float32, device=self.device) @ self.weights
        name = torch.cuda.get_device_name(0) if self.device.type == "cuda" else "cpu"
        return [{"device": name, "pid": os.getpid(), "scores": row.tolist()} for row in scores.cpu()]
'''
TORCH_CORTEX_YAML = f"""- name: {TORCH_API_NAME}
  kind: BatchAPI
  predictor:
    type: python
    path: torch_predictor.py
  compute: {{gpu: 1}}
"""
CORTEX_YAML = f"""- name: {API_NAME}
  kind: BatchAPI
  predictor:
    type: onnx
    path: predictor.py
    models: {{path: models/mlp/}}
  compute: {{gpu: 1}}
"""


@dataclass
class Result:
    """One line of the summary: PASS, FAIL, SKIP (could not run here, and why) or INFO (a figure)."""

    part: str
    check: str
    status: str
    detail: str


class Report:
    """The results so far; each is printed as it is added, so a run cut short still shows them."""

    def __init__(self) -> None:
        self.results: list[Result] = []
        self.facts: dict[str, Any] = {}

    def add(self, part: str, check: str, status: str, detail: str) -> None:
        result = Result(part, check, status, detail)
        self.results.append(result)
        print(f"[{part}] {status:<4} {check}: {detail}", flush=True)

    def verdict(self, part: str, check: str, ok: bool, detail: str) -> None:
        self.add(part, check, "PASS" if ok else "FAIL", detail)

    def table(self) -> str:
        widths = [max(len(getattr(r, f)) for r in [*self.results, Result("part", "check", "result", "")])
                  for f in ("part", "check", "status")]
        lines = [f"{'part':<{widths[0]}}  {'check':<{widths[1]}}  {'result':<{widths[2]}}  detail"]
        lines.append("-" * min(120, sum(widths) + 40))
        lines += [f"{r.part:<{widths[0]}}  {r.check:<{widths[1]}}  {r.status:<{widths[2]}}  {r.detail}"
                  for r in self.results]
        return "\n".join(lines)

    @property
    def failed(self) -> bool:
        return any(r.status == "FAIL" for r in self.results)


def run_part(report: Report, part: str, body: Callable[[], None]) -> None:
    """Run one part; a missing module is a SKIP naming it, any other error a FAIL with its cause."""
    started = time.perf_counter()
    print(f"\n== part {part} ==", flush=True)
    try:
        body()
    except ImportError as e:
        report.add(part, "imports", "SKIP", f"{type(e).__name__}: {e} (were the wheels installed?)")
    except Exception as e:  # noqa: BLE001 - one part failing must not hide the others' results
        traceback.print_exc()
        report.add(part, "ran", "FAIL", f"{type(e).__name__}: {e}")
    print(f"(part {part}: {time.perf_counter() - started:.1f} s)", flush=True)


def version_of(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# -- (a) the host --------------------------------------------------------------------------------
def part_host(report: Report) -> None:
    report.add("a", "python", "INFO", f"{platform.python_version()} on {platform.machine()}, {sys.executable}")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        report.add("a", "nvidia-smi -L", "SKIP", "nvidia-smi is not on PATH")
    else:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
        gpus = (listed.stdout or listed.stderr).strip().replace("\n", "; ")
        report.add("a", "nvidia-smi -L", "INFO" if listed.returncode == 0 else "FAIL", gpus or "(no output)")
    if importlib.util.find_spec("onnxruntime") is None:
        report.add("a", "onnxruntime", "SKIP", "onnxruntime is not installed: parts b and c need it")
    else:
        import onnxruntime

        providers = onnxruntime.get_available_providers()
        report.facts["onnxruntime_providers"] = providers
        report.facts["cuda_in_onnxruntime"] = CUDA in providers
        wheel = version_of("onnxruntime-gpu", "onnxruntime") or "unknown distribution"
        report.add("a", "onnxruntime", "INFO", f"{onnxruntime.__version__} ({wheel}), device "
                   f"{onnxruntime.get_device()}, providers: {', '.join(providers)}")
        if CUDA not in providers:
            report.add("a", "onnxruntime CUDA", "SKIP", "this onnxruntime is a CPU-only build (no "
                       "CUDAExecutionProvider): the GPU timings of part b are skipped and part c checks "
                       "the CPU fallback; onnxruntime-gpu is needed for the GPU path")
    if importlib.util.find_spec("torch") is None:
        report.add("a", "torch CUDA", "SKIP", "torch is not installed")
    else:
        import torch

        usable = torch.cuda.is_available()
        name = torch.cuda.get_device_name(0) if usable else "no usable CUDA device"
        report.add("a", "torch CUDA", "INFO", f"torch {torch.__version__}, CUDA {torch.version.cuda}: {name}")
    if importlib.util.find_spec("tensorflow") is None:
        report.add("a", "tensorflow", "SKIP", "TensorFlow is not installed on this host: the TensorFlow GPU "
                   "path (hardware.tensorflow_device, tensorflow_client) is not checked")
    else:
        report.add("a", "tensorflow", "INFO", f"installed ({version_of('tensorflow', 'tensorflow-cpu')}); "
                   "this check does not exercise its GPU path")


# -- the model and the project -------------------------------------------------------------------
def mlp_model(seed: int = 0) -> bytes:
    """32 -> 1024 -> 1024 -> 10 with Relu, fixed-seed float32 weights (~1.1M): bench/onnx_batch.py's MLP."""
    from itertools import pairwise

    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights, current = [], [], "X"
    for i, (n_in, n_out) in enumerate(pairwise(LAYERS)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(np.zeros(n_out, np.float32), f"B{i}")]
        nodes.append(helper.make_node("Gemm", [current, f"W{i}", f"B{i}"], [f"H{i}"]))
        if i < len(LAYERS) - 2:
            nodes.append(helper.make_node("Relu", [f"H{i}"], [current := f"R{i}"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info(f"H{len(LAYERS) - 2}", TensorProto.FLOAT, ["N", LAYERS[-1]])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def write_project(folder: Path) -> Path:
    """The project deployed in part c and read in part b: cortex.yaml, predictor.py, models/mlp/1/."""
    model = folder / "models" / "mlp" / "1" / "model.onnx"
    model.parent.mkdir(parents=True)
    model.write_bytes(mlp_model())
    (folder / "predictor.py").write_text(PREDICTOR)
    (folder / "cortex.yaml").write_text(CORTEX_YAML)
    return folder / "cortex.yaml"


def cpu_reference(model: Path, rows: np.ndarray) -> np.ndarray:
    """The model's outputs from a plain CPU session: what the other runs are compared with."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model), providers=[CPU])
    return np.asarray(session.run(None, {"X": rows})[0])


# -- (b) Sluice's ONNX client --------------------------------------------------------------------
def time_predict(client: Any, batch: np.ndarray, seconds: float) -> tuple[float, float, int]:
    """Median and 90th percentile of one `predict`, in ms, after a warm-up; and how many were timed."""
    for _ in range(10):
        client.predict(batch)
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop and len(times) < 2000:
        started = time.perf_counter()
        client.predict(batch)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), statistics.quantiles(times, n=10)[-1], len(times)


def preload_would_help(model: Path) -> str:
    """In a child process, so this one stays as Sluice runs: does `onnxruntime.preload_dlls()`
    (onnxruntime >= 1.21: the CUDA and cuDNN libraries of pip's nvidia-* packages) give CUDA?"""
    code = ("import onnxruntime as o; getattr(o, 'preload_dlls', lambda: None)(); "
            f"print(o.InferenceSession({str(model)!r}, providers={[CUDA, CPU]!r}).get_providers())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return (done.stdout.strip() or done.stderr.strip()[-300:]) or f"exit {done.returncode}"


def part_client(report: Report, project: Path, batch_rows: int, seconds: float) -> None:
    from predictors_runtime.builder import make_client
    from predictors_runtime.config import load_api_configs

    if "onnxruntime_providers" not in report.facts:
        report.add("b", "onnx client", "SKIP", "onnxruntime is not installed")
        return
    gpu_api = load_api_configs(project / "cortex.yaml")[0]
    cpu_api = gpu_api.model_copy(update={"compute": gpu_api.compute.model_copy(update={"gpu": 0, "cpu": 1})})
    cache = project.parent / "client-cache"
    batch = np.random.default_rng(1).standard_normal((batch_rows, FEATURES)).astype(np.float32)
    expected = cpu_reference(project / "models" / "mlp" / "1" / "model.onnx", batch)
    cuda_here = bool(report.facts.get("cuda_in_onnxruntime"))
    figures: dict[str, float] = {}
    for label, api in (("gpu", gpu_api), ("cpu", cpu_api)):
        client = make_client(api, project, cache / label, poll_interval_s=3600)
        try:
            in_use = client.get_model()["session"].get_providers()
            report.facts[f"client_{label}_providers"] = in_use
            if label == "gpu":
                if cuda_here:
                    report.verdict("b", "compute.gpu=1 session", in_use[0] == CUDA, f"providers in use: {in_use}")
                    if in_use[0] != CUDA:
                        report.add("b", "preload_dlls()", "INFO", "would a child with onnxruntime.preload_dlls() get "
                                   f"CUDA? {preload_would_help(project / 'models' / 'mlp' / '1' / 'model.onnx')}")
                else:
                    report.verdict("b", "compute.gpu=1 session", in_use == [CPU],
                                   f"providers in use: {in_use} (the CPU fallback: no CUDA in this onnxruntime)")
            outputs = np.asarray(client.predict(batch)[0])
            diff = float(np.abs(outputs - expected).max())
            report.verdict("b", f"{label} outputs vs CPU session", diff < 1e-2, f"max |difference| {diff:.2e}")
            if label == "gpu" and in_use[0] != CUDA:
                report.add("b", f"time per batch of {batch_rows} (GPU)", "SKIP", "the session is not on CUDA")
                continue
            median, p90, count = time_predict(client, batch, seconds)
            figures[label] = median
            threads = os.environ.get("OMP_NUM_THREADS") or "onnxruntime's default"
            where = in_use[0] + ("" if label == "gpu" else f", intra-op threads: {threads}")
            report.add("b", f"time per batch of {batch_rows} ({label.upper()})", "INFO",
                       f"median {median:.3f} ms, p90 {p90:.3f} ms over {count} predict() calls ({where})")
        finally:
            client.stop_reloading()
    if "gpu" in figures and "cpu" in figures:
        report.facts["gpu_speedup"] = figures["cpu"] / figures["gpu"]
        report.add("b", "CPU time / GPU time", "INFO", f"{figures['cpu'] / figures['gpu']:.2f}x "
                   f"({figures['cpu']:.3f} ms vs {figures['gpu']:.3f} ms per batch of {batch_rows})")


# -- (c) a batch job on the gpu queue ------------------------------------------------------------
def read_rows(out: str, job_id: str) -> list[dict[str, Any]]:
    """Every row a job wrote, in order, from its manifest (as tests/integration read them)."""
    from predictors_runtime.storage import join_uri, storage_for

    storage = storage_for(out)
    manifest = json.loads(storage.read_bytes(join_uri(out, job_id, "_manifest.json")))
    rows: list[dict[str, Any]] = []
    for part in manifest["parts"]:
        rows += [json.loads(line) for line in storage.read_bytes(part["path"]).decode().splitlines()]
    return rows


def log_messages(path: Path) -> list[str]:
    """The messages of a node's log: its JSON lines' `message`, other lines as they are."""
    messages = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            messages.append(str(json.loads(line)["message"]))
        except (ValueError, KeyError, TypeError):
            messages.append(line.strip())
    return messages


def part_stack(report: Report, project: Path, job_rows: int, batch_rows: int, timeout: float,
               out_dir: Path | None) -> None:
    from sluice.client import Client
    from sluice.embedded import Stack, free_port

    if "onnxruntime_providers" not in report.facts:
        report.add("c", "batch job", "SKIP", "onnxruntime is not installed")
        return
    if shutil.which("redis-server") is None:
        report.add("c", "batch job", "SKIP", "no redis-server on PATH (gpu_check.sh puts .gpucheck/redis's there)")
        return
    work = project.parent
    started = time.perf_counter()
    stack = Stack(port=free_port(), workers=1, queues=("gpu",), proxy=False, realtime=False, api_processes=1,
                  data_dir=work / "stack", env={"SLUICE_LOCAL_INPUT_ROOTS": str(work)})
    try:
        stack.start()
        report.add("c", "stack started", "PASS", f"redis-server, API, beat, worker -Q gpu in "
                   f"{time.perf_counter() - started:.1f} s")
        client = Client(stack.url)
        client.deploy(project / "cortex.yaml")
        queue = client.api(API_NAME)["queue"]
        report.verdict("c", "API queue", queue == "gpu", f"compute.gpu=1 deployed to queue {queue!r}")
        rows = np.random.default_rng(2).standard_normal((job_rows, FEATURES)).round(4).astype(np.float32)
        out = str(work / "out")
        spec = client.submit_raw(API_NAME, {"workers": 1, "item_list": {"items": rows.tolist(),
                                                                         "batch_size": batch_rows},
                                            "output": {"path": out}})
        status = client.wait(API_NAME, spec["job_id"], timeout=timeout)
        batches = -(-job_rows // batch_rows)
        metrics = status.get("batch_metrics", {})
        report.verdict("c", "batch job", status["status"] == "status_succeeded"
                       and metrics.get("succeeded") == batches,
                       f"{status['status']}, batches {metrics} (expected {batches} succeeded), "
                       f"{job_rows} rows in {time.perf_counter() - started:.1f} s since the stack's start")
        if status["status"] != "status_succeeded":
            return
        written = read_rows(out, spec["job_id"])
        providers = sorted({tuple(row["providers"]) for row in written})
        node_providers = list(providers[0]) if len(providers) == 1 else providers
        report.facts["node_providers"] = node_providers
        if report.facts.get("cuda_in_onnxruntime"):
            report.verdict("c", "node's session", providers == [(CUDA, CPU)], f"providers in use: {node_providers}")
        else:
            report.verdict("c", "node's session", providers == [(CPU,)],
                           f"providers in use: {node_providers} (the CPU fallback: no CUDA in this onnxruntime)")
        scores = np.array([row["scores"] for row in written], dtype=np.float32)
        expected = cpu_reference(project / "models" / "mlp" / "1" / "model.onnx", rows)
        diff = float(np.abs(scores - expected).max()) if scores.shape == expected.shape else float("inf")
        report.verdict("c", "job outputs vs CPU session", diff < 1e-2,
                       f"{len(written)} rows, max |difference| {diff:.2e}")
        part_torch(report, client, work, rows, batch_rows, timeout)
        worker = next(child for child in stack.children if child.is_worker)
        messages = log_messages(worker.log_path)
        loaded = [m for m in messages if "loaded with onnxruntime providers" in m]
        fallback = [m for m in messages if "running on CPU" in m]
        report.verdict("c", "node log at model load", bool(loaded), (loaded or ["no such line"])[-1])
        if fallback:
            report.add("c", "node log: CPU fallback", "INFO", fallback[-1])
    finally:
        if out_dir is not None:
            for child in stack.children:
                if child.is_worker or child.name == "api":
                    with open(child.log_path, "rb") as log:  # the end: a task's line holds its batch
                        log.seek(max(0, log.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                        (out_dir / f"gpu_check_{child.name}.log").write_bytes(log.read())
        stack.stop()


def part_torch(report: Report, client: Any, work: Path, rows: np.ndarray, batch_rows: int, timeout: float) -> None:
    """A python predictor using torch, on the same `-Q gpu` node: the GPU is the predictor's own."""
    if importlib.util.find_spec("torch") is None:
        report.add("d", "torch predictor", "SKIP", "torch is not installed here")
        return
    import torch

    folder = work / "torch-project"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "torch_predictor.py").write_text(TORCH_PREDICTOR)
    (folder / "cortex.yaml").write_text(TORCH_CORTEX_YAML)
    client.deploy(folder / "cortex.yaml")
    out = str(work / "out-torch")
    started = time.perf_counter()
    spec = client.submit_raw(TORCH_API_NAME, {"workers": 1, "item_list": {"items": rows.tolist(),
                                                                           "batch_size": batch_rows},
                                              "output": {"path": out}})
    status = client.wait(TORCH_API_NAME, spec["job_id"], timeout=timeout)
    report.verdict("d", "torch batch job", status["status"] == "status_succeeded",
                   f"{status['status']} in {time.perf_counter() - started:.1f} s, {status.get('batch_metrics')}")
    if status["status"] != "status_succeeded":
        return
    written = read_rows(out, spec["job_id"])
    devices = sorted({row["device"] for row in written})
    expected = "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(0)
    report.verdict("d", "torch device on the node", devices == [expected], f"devices in use: {devices}")
    weights = torch.randn(32, 10, generator=torch.Generator().manual_seed(0))
    reference = (torch.tensor(rows) @ weights).numpy()
    scores = np.array([row["scores"] for row in written], dtype=np.float32)
    diff = float(np.abs(scores - reference).max()) if scores.shape == reference.shape else float("inf")
    report.verdict("d", "torch outputs vs CPU", diff < 1e-2, f"{len(written)} rows, max |difference| {diff:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-rows", type=int, default=256, help="rows per batch (part b's timing, part c's job)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time spent measuring each provider in part b")
    parser.add_argument("--job-rows", type=int, default=1024, help="rows of part c's job")
    parser.add_argument("--job-timeout", type=float, default=150.0, help="seconds part c's job may take")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack and clean up when killed too
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    report = Report()
    work = Path(tempfile.mkdtemp(prefix="sluice-gpu-check-"))
    try:
        run_part(report, "a", lambda: part_host(report))
        project = work / "project"
        if importlib.util.find_spec("onnx") is None:
            report.add("b", "model", "SKIP", "the onnx package is not installed: no model to run")
        else:
            write_project(project)
            run_part(report, "b", lambda: part_client(report, project, args.batch_rows, args.seconds))
            run_part(report, "c", lambda: part_stack(report, project, args.job_rows, args.batch_rows,
                                                      args.job_timeout, out_dir))
    finally:
        print("\n== summary ==\n" + report.table(), flush=True)
        if out_dir is not None:
            summary = {"results": [asdict(r) for r in report.results], "facts": report.facts}
            (out_dir / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str))
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if report.failed else 0)


if __name__ == "__main__":
    main()
