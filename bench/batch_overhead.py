"""Per-batch overhead of Sluice against plain Celery and an in-process loop (`make bench`).

The same no-op predictor runs over the same items at several batch sizes:
- Sluice end to end: HTTP submission, job record, one task per batch on the job's queue,
  batch recording, the chord body and `on_job_complete`; two worker nodes.
- plain Celery: the same number of no-op tasks with the same payloads, as a chord (the plain way
  to know when a batch of tasks is done) through the same Redis, on two worker processes.
- in-process: a loop calling the predictor over the batches, no queue at all.
Times come from the server's clock (job start and end times; the chord body's timestamp),
so polling does not blur them. Run: `python bench/batch_overhead.py [--items N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import chord  # noqa: E402

from sluice.client import Client  # noqa: E402
from sluice.embedded import Stack, free_port  # noqa: E402

NOOP_PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config, job_spec):
        pass

    def predict(self, payload, batch_id):
        for _ in payload:
            pass

    def on_job_complete(self):
        pass
'''
CORTEX_YAML = "- name: noop\n  kind: BatchAPI\n  predictor:\n    type: python\n    path: predictor.py\n"


def seconds_between(start: str, end: str) -> float:
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(end) - parse(start)).total_seconds()


def run_sluice(client: Client, items: list, batch_size: int, workers: int) -> float:
    spec = client.submit("noop", items, batch_size=batch_size, workers=workers)
    final = client.wait("noop", spec["job_id"], timeout=1800, poll=0.2)
    assert final["status"] == "status_succeeded", final
    return seconds_between(final["start_time"], final["end_time"])


def run_plain(redis_url: str, items: list, batch_size: int) -> float:
    os.environ["SLUICE_REDIS_URL"] = redis_url
    from bench.plain_celery_app import app

    key = f"bench:done:{uuid.uuid4().hex}"
    batches = [items[i : i + batch_size] for i in range(0, len(items), batch_size)]
    started = time.time()
    header = [app.signature("plain.batch", args=(b,), immutable=True, ignore_result=True) for b in batches]
    chord(header, app=app)(app.signature("plain.done", args=(key,), immutable=True, ignore_result=True))
    client = redis.Redis.from_url(redis_url)
    while (ended := client.get(key)) is None:
        time.sleep(0.01)
    return float(ended) - started


def run_in_process(items: list, batch_size: int) -> float:
    namespace: dict = {}
    exec(NOOP_PREDICTOR, namespace)
    predictor = namespace["PythonPredictor"]({}, {})
    started = time.perf_counter()
    for index, i in enumerate(range(0, len(items), batch_size)):
        predictor.predict(items[i : i + batch_size], str(index))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--batch-sizes", default="10,100,1000")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    args = parser.parse_args()
    items = [{"id": i, "x": i * 0.5} for i in range(args.items)]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    project = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    (project / "predictor.py").write_text(NOOP_PREDICTOR)
    (project / "cortex.yaml").write_text(CORTEX_YAML)

    with Stack(port=free_port(), workers=args.workers, queues=("cpu",), worker_loglevel="WARNING") as stack:
        env = {**os.environ, "SLUICE_REDIS_URL": stack.redis_url or "", "PYTHONPATH": str(ROOT)}
        plain_workers = [
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.plain_celery_app", "worker", "-Q", "plain",
                 "-c", "1", "-n", f"plain{n}@%h", "--without-gossip", "--without-mingle", "--loglevel", "WARNING"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            for n in range(args.workers)
        ]
        try:
            client = Client(stack.url)
            client.deploy(project / "cortex.yaml")
            run_sluice(client, items[:1000], 100, args.workers)  # warm up: imports, predictor build
            run_plain(stack.redis_url or "", items[:1000], 100)
            print(f"{args.items} items, {args.workers} worker processes each, no-op predictor, "
                  f"median of {args.repeat} runs\n")
            print(f"{'batch':>6} {'batches':>8} {'sluice items/s':>15} {'celery items/s':>15} "
                  f"{'loop items/s':>14} {'sluice/celery':>14} {'sluice/loop':>12}")
            for batch_size in batch_sizes:
                sluice_runs, plain_runs, loop_runs = [], [], []
                for _ in range(args.repeat):  # interleaved, so drift on the machine hits both alike
                    sluice_runs.append(run_sluice(client, items, batch_size, args.workers))
                    plain_runs.append(run_plain(stack.redis_url or "", items, batch_size))
                    loop_runs.append(run_in_process(items, batch_size))
                sluice_s, plain_s, loop_s = (statistics.median(r) for r in (sluice_runs, plain_runs, loop_runs))
                rate = lambda s: args.items / s  # noqa: E731
                print(f"{batch_size:>6} {-(-args.items // batch_size):>8} {rate(sluice_s):>15,.0f} "
                      f"{rate(plain_s):>15,.0f} {rate(loop_s):>14,.0f} {plain_s / sluice_s:>14.2f} "
                      f"{loop_s / sluice_s:>12.4f}")
        finally:
            for worker in plain_workers:
                worker.terminate()
            for worker in plain_workers:
                worker.wait(timeout=30)


if __name__ == "__main__":
    main()
