"""Waiting in integration tests: poll a condition until it holds, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """`check()`'s first truthy result, polled every `interval` s; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
