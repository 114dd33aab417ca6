"""The baseline of `batch_overhead.py`: plain Celery tasks doing the same no-op through the same Redis."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

app = Celery("plain", broker=os.environ["SLUICE_REDIS_URL"], backend=os.environ["SLUICE_REDIS_URL"])
app.conf.update(
    task_acks_late=True, worker_prefetch_multiplier=1, task_default_queue="plain",
    task_serializer="json", accept_content=["json"], worker_hijack_root_logger=False,
)


def noop_predict(payload):
    """The same work as the benchmark's Sluice predictor: nothing, per item."""
    for _ in payload:
        pass


@app.task(name="plain.batch", ignore_result=True)
def batch(payload):
    noop_predict(payload)


@app.task(name="plain.done", ignore_result=True)
def done(key):
    redis.Redis.from_url(os.environ["SLUICE_REDIS_URL"]).set(key, repr(time.time()))


_SESSIONS: dict = {}


@app.task(name="plain.onnx_row")
def onnx_row(model_path, names, row):
    """The baseline of `async_api.py`: one row through the ONNX model (a session per process, kept),
    returning the output row and when it was done (the worker's clock)."""
    import numpy as np

    from bench.onnx_batch import session

    sess = _SESSIONS.get(model_path)
    if sess is None:
        sess = _SESSIONS[model_path] = session(model_path)
    [out, *_] = sess.run(None, {sess.get_inputs()[0].name: np.array([[row[n] for n in names]], dtype=np.float32)})
    return {"result": out[0].tolist(), "done": time.time()}
