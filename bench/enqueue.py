"""Enqueue speed and API memory for `delimited_files` jobs, against how fast workers drain them.

A JSON-lines file (`--lines`, default 1,000,000 items of ~65 bytes) is submitted as a
`delimited_files` job to the embedded stack (two worker nodes, the no-op predictor of
`batch_overhead.py`), once from a local path and once from S3 (moto's standalone server).
- enqueue time: from the job's `start_time` (server clock, set at submission) until polling
  (every 20 ms) first sees it leave `status_enqueuing`: the API streamed and validated every
  line, cut byte ranges and published one task per batch as it went (workers are told to start
  only once the whole input is validated, so nothing is drained meanwhile).
- API memory: VmRSS of the gunicorn worker processes, sampled every 10 ms while enqueuing;
  the largest growth of one process over its RSS just before submission is shown.
- drain: items the workers finished after the job turned running, divided by
  `end_time` (server clock) minus that moment.
The ratio enqueue items/s / drain items/s above 1 means cutting batches is not the bottleneck.
The S3 job is stopped once enqueued unless `--s3-drain`: moto 5 reads the whole object for every
ranged GET, so an S3 drain here measures moto, not Sluice (the local drain is the reference).
Run: `python bench/enqueue.py [--lines N] [--batch-size B] [--s3-drain]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import requests  # noqa: E402

from bench.batch_overhead import CORTEX_YAML, NOOP_PREDICTOR  # noqa: E402
from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

MIB = 1024 * 1024


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def write_input(path: Path, lines: int) -> int:
    rng = random.Random(0)
    with open(path, "w", buffering=4 * MIB) as f:
        for i in range(lines):
            f.write(json.dumps({"id": i, "x": [round(rng.random(), 4) for _ in range(5)]}) + "\n")
    return path.stat().st_size


def start_moto(cwd: Path) -> tuple[subprocess.Popen, str]:
    """moto's S3 server, as tests/conftest.py starts it; points AWS_* of this process (and children) at it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError("moto server did not start")
        try:
            requests.get(endpoint + "/", timeout=1)
            break
        except requests.RequestException:
            time.sleep(0.05)
    os.environ.pop("AWS_SESSION_TOKEN", None)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    return process, endpoint


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def api_worker_pids(stack: Stack) -> list[int]:
    master = next(c for c in stack.children if c.name == "api").process.pid
    pids: list[int] = []
    for task in Path(f"/proc/{master}/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss(threading.Thread):
    """Samples the RSS of `pids` every 10 ms until stopped; keeps each one's peak."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.peak = {pid: rss(pid) for pid in pids}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.01):
            for pid in self.peak:
                self.peak[pid] = max(self.peak[pid], rss(pid))


def run_source(client: Client, stack: Stack, uri: str, lines: int, batch_size: int, drain: bool = True) -> dict:
    pids = api_worker_pids(stack)
    before = {pid: rss(pid) for pid in pids}
    sampler = PeakRss(pids)
    sampler.start()
    body = {"workers": 2, "delimited_files": {"s3_paths": [uri], "batch_size": batch_size}}
    try:
        submitted = time.time()
        spec = client.submit_raw("noop", body)
        while (status := client.job("noop", spec["job_id"]))["status"] == "status_enqueuing":
            time.sleep(0.02)
        running_at = time.time()
    finally:
        sampler.done.set()
        sampler.join()
    done_at_running = status["batch_metrics"]["succeeded"]
    if not drain:
        client.stop("noop", spec["job_id"])
    final = client.wait("noop", spec["job_id"], timeout=3600, poll=0.2)
    assert final["status"] == ("status_succeeded" if drain else "status_stopped"), final
    started, ended = epoch(final["start_time"]), epoch(final["end_time"])
    growth = {pid: sampler.peak[pid] - before[pid] for pid in pids}
    grown = max(growth, key=growth.get)
    return {
        "batches": final["total_batch_count"], "enqueue_s": running_at - started,
        "client_enqueue_s": running_at - submitted,
        "rss_before": before[grown], "rss_peak": sampler.peak[grown], "rss_after": rss(grown),
        "drain_s": ended - running_at if drain else None,
        "drained_items": lines - min(done_at_running * batch_size, lines),
        "done_at_running": done_at_running, "total_s": ended - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--s3-drain", action="store_true", help="also wait for the S3 job's drain (slow on moto)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cleanup below runs

    folder = Path(tempfile.mkdtemp(prefix="sluice-bench-enqueue-"))
    moto = None
    try:
        data = folder / "input.jsonl"
        size = write_input(data, args.lines)
        (folder / "moto").mkdir()
        moto, _ = start_moto(folder / "moto")
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        s3.upload_file(str(data), "bench", "input.jsonl")
        project = folder / "project"
        project.mkdir()
        (project / "predictor.py").write_text(NOOP_PREDICTOR)
        (project / "cortex.yaml").write_text(CORTEX_YAML)

        with Stack(port=free_port(), workers=2, queues=("cpu",), worker_loglevel="WARNING",
                   env={"SLUICE_LOCAL_INPUT_ROOTS": str(folder)}) as stack:
            client = Client(stack.url)
            client.deploy(project / "cortex.yaml")
            results = {
                "local": run_source(client, stack, str(data), args.lines, args.batch_size),
                "s3": run_source(client, stack, "s3://bench/input.jsonl", args.lines, args.batch_size,
                                 drain=args.s3_drain),
            }

        print(f"\n{args.lines:,} lines ({size / MIB:.1f} MiB), batch size {args.batch_size}, "
              f"2 worker nodes, no-op predictor, {os.cpu_count()} CPUs\n")
        print(f"{'source':>6} {'batches':>8} {'enqueue s':>10} {'enq items/s':>12} {'enq batch/s':>12} "
              f"{'API RSS MiB before/peak/after':>30} {'growth':>7} {'drain s':>8} {'drain items/s':>14}")
        local = results["local"]
        drain_rate = local["drained_items"] / local["drain_s"]
        for name, r in results.items():
            mem = f"{r['rss_before'] / MIB:.0f} / {r['rss_peak'] / MIB:.0f} / {r['rss_after'] / MIB:.0f}"
            drain = (f"{r['drain_s']:>8.2f} {r['drained_items'] / r['drain_s']:>14,.0f}" if r["drain_s"]
                     else f"{'-':>8} {'-':>14}")
            print(f"{name:>6} {r['batches']:>8,} {r['enqueue_s']:>10.2f} {args.lines / r['enqueue_s']:>12,.0f} "
                  f"{r['batches'] / r['enqueue_s']:>12,.0f} {mem:>30} "
                  f"{(r['rss_peak'] - r['rss_before']) / MIB:>+7.1f} {drain}")
        ratios = {name: (args.lines / r["enqueue_s"]) / drain_rate for name, r in results.items()}
        print("\nenqueue rate / local drain rate: " + ", ".join(f"{n} {v:.2f}" for n, v in ratios.items()))
        verdict = ("enqueueing outpaces the workers for every source" if min(ratios.values()) > 1
                   else "enqueueing is SLOWER than the workers drain for at least one source")
        print(f"verdict: {verdict}")
    finally:
        if moto is not None:
            stop_process(moto)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
