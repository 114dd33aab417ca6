"""Choosing where a model runs: the GPU when the API asked for one and the runtime can use it.

An API with `compute.gpu > 0` is routed to the gpu queue, but the worker that picks it up may
still lack a usable CUDA (a CPU-only wheel, no driver). The model then runs on the CPU and a
warning says so, rather than the job failing.

Both checks ask the runtime itself, so they import it; call them only where a model is being
loaded, in the worker process (never before a fork: see PITFALLS, "CUDA after fork"). The
`available` argument replaces the runtime's answer, for tests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

logger = logging.getLogger(__name__)

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def onnx_providers(gpu: bool, available: Sequence[str] | None = None) -> list[str]:
    """The onnxruntime execution providers to create a session with, best first.

    `available` defaults to `onnxruntime.get_available_providers()`.
    """
    if not gpu:
        return [CPU_PROVIDER]
    if available is None:
        import onnxruntime  # type: ignore[import-untyped,unused-ignore]

        available = onnxruntime.get_available_providers()
    if CUDA_PROVIDER in available:
        return [CUDA_PROVIDER, CPU_PROVIDER]
    logger.warning("compute.gpu > 0 but CUDA is not available to onnxruntime; running on CPU")
    return [CPU_PROVIDER]


def tensorflow_device(gpu: bool, available: Sequence[object] | None = None) -> str:
    """The TensorFlow device to run a model on: "/GPU:0" or "/CPU:0".

    `available` defaults to `tf.config.list_physical_devices("GPU")` (any non-empty sequence
    means a GPU is usable).
    """
    if not gpu:
        return "/CPU:0"
    if available is None:
        import tensorflow as tf  # type: ignore[import-untyped,unused-ignore]

        available = tf.config.list_physical_devices("GPU")
    if available:
        return "/GPU:0"
    logger.warning("compute.gpu > 0 but no GPU is available to TensorFlow; running on CPU")
    return "/CPU:0"


def cpu_threads(env: Mapping[str, str] | None = None) -> int | None:
    """Threads one model session may use, from `OMP_NUM_THREADS` (None: the runtime's default).

    onnxruntime ignores OMP_NUM_THREADS and starts one thread per core in every session, so
    several single-process worker nodes on one host would oversubscribe it; operators set the
    variable per node and Sluice passes it on.
    """
    raw = (os.environ if env is None else env).get("OMP_NUM_THREADS", "")
    try:
        threads = int(raw)
    except ValueError:
        return None
    return threads if threads > 0 else None
