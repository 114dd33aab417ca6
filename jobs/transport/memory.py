"""The job queues in memory: a `JobQueues` that remembers what it was asked, for fast tests of placement,
settling and the batch path. It moves no message (there is no broker behind it): what a broker does
with the messages is tested against kombu and Redis in tests/integration/ (test_give_back.py,
test_settle.py, test_lost_batches.py). Production code never imports it.
"""

from __future__ import annotations

from collections.abc import Collection


class MemoryJobQueues:
    """`JobQueues` that remembers what it was asked: `calls` holds ("add" | "cancel", queue, nodes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, list[str]]] = []
        self.dropped: list[str] = []
        self.given_back: list[str] = []
        self.acknowledged: list[str] = []

    def add_consumers(self, queue: str, nodes: list[str]) -> None:
        self.calls.append(("add", queue, list(nodes)))

    def cancel_consumers(self, queue: str, nodes: list[str]) -> None:
        self.calls.append(("cancel", queue, list(nodes)))

    def drop(self, queue: str) -> None:
        self.dropped.append(queue)

    def give_back(self, task_ids: Collection[str]) -> None:
        self.given_back.extend(sorted(task_ids))

    def acknowledge(self, task_ids: Collection[str]) -> None:
        self.acknowledged.extend(sorted(task_ids))
