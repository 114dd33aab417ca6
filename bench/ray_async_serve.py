"""Ray Serve's asynchronous inference on the bench's ONNX model, for bench/async_api.py's peer row.

Runs in its own virtual environment (`bench/requirements-ray.lock`: Ray pins versions of packages
Sluice also uses), started by bench/async_api.py with the rows in a JSON file. A `@task_consumer`
deployment of `--processes` replicas (one task at a time each, as Sluice's nodes and the plain
Celery workers run) takes the tasks from Celery on the bench's Redis; `--clients` threads enqueue
one row each through Ray's own adapter (`instantiate_adapter_from_config`, a Celery `send_task`:
no HTTP, as plain Celery's `delay`), then read each outcome with `get_task_status_sync`.
Prints, per run, a JSON list of [enqueued, done] times (the handler's clock when the row was done).

Run: `bench/.venv-ray/bin/python bench/ray_async_serve.py --redis URL --model PATH --features N
--rows FILE [--runs R]` (bench/async_api.py does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray
from ray import serve
from ray.serve.schema import CeleryAdapterConfig, TaskProcessorConfig
from ray.serve.task_consumer import instantiate_adapter_from_config, task_consumer, task_handler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realtime_apps import RowModel

QUEUE = "sluice_bench_ray"
WARMUP_ROWS = 100


def processor_config(redis_url: str) -> TaskProcessorConfig:
    return TaskProcessorConfig(queue_name=QUEUE, max_retries=0,
                               adapter_config=CeleryAdapterConfig(broker_url=redis_url, backend_url=redis_url))


def consumer_app(config: TaskProcessorConfig, model: str, features: int, processes: int):
    @serve.deployment(num_replicas=processes, max_ongoing_requests=1, ray_actor_options={"num_cpus": 0})
    @task_consumer(task_processor_config=config)
    class OnnxConsumer:
        def __init__(self) -> None:
            self.model = RowModel(model, features)

        @task_handler(name="predict")
        def predict(self, row: dict) -> dict:
            out = self.model.rows([row])[0]
            return {"done": time.time(), "out": out}

    return OnnxConsumer.bind()


def run(adapter, rows: list[dict], clients: int) -> list[tuple[float, float]]:
    def enqueue(row: dict) -> tuple[float, str]:
        sent = time.time()
        return sent, adapter.enqueue_task_sync(task_name="predict", args=[row]).id

    with ThreadPoolExecutor(clients) as pool:
        sent = list(pool.map(enqueue, rows))
    spans = []
    deadline = time.monotonic() + 600
    for at, task_id in sent:
        # The adapter reads the result before the status: a task that succeeded in between comes back
        # SUCCESS without its result, which the next read has.
        while not ((status := adapter.get_task_status_sync(task_id)).status == "SUCCESS"
                   and isinstance(status.result, dict)):
            if status.status == "FAILURE" or time.monotonic() > deadline:
                raise RuntimeError(f"task {task_id}: {status.status} {status.result}")
            time.sleep(0.01)
        spans.append((at, status.result["done"]))
    return spans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--features", type=int, required=True)
    parser.add_argument("--rows", required=True, help="a JSON file of rows")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    rows = json.loads(Path(args.rows).read_text())
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(num_cpus=args.processes, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        config = processor_config(args.redis)
        serve.run(consumer_app(config, args.model, args.features, args.processes), name="bench", route_prefix=None)
        adapter = instantiate_adapter_from_config(task_processor_config=config)
        run(adapter, rows[:WARMUP_ROWS], args.clients)
        for _ in range(args.runs):
            time.sleep(1.0)
            print(json.dumps(run(adapter, rows, args.clients)), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
