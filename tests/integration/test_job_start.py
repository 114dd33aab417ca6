"""A placed job's nodes start on it as soon as they are told, not when their wait for messages ends
(`jobs/transport/broker.py`: adding a queue ends the BRPOP a node waits in)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.embedded import Stack, free_port

from .conftest import FAST_LOOPS, closing_client, read_events, write_project

pytestmark = pytest.mark.integration

# Each idle node waits this long in one BRPOP: far longer than the test gives the job.
LONG_POLL_S = 120


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(port=free_port(), workers=1, proxy=False, realtime=False,
               data_dir=tmp_path_factory.mktemp("job-start"),
               env={**FAST_LOOPS, "SLUICE_BROKER_POLL_INTERVAL": str(LONG_POLL_S)}) as running:
        yield running
        print(running.logs())


def test_an_idle_node_waiting_in_a_long_brpop_runs_a_new_job_at_once(stack: Stack, tmp_path: Path) -> None:
    client = closing_client(stack.url)
    api = f"start-{uuid.uuid4().hex[:8]}"
    events = tmp_path / "events.jsonl"
    client.deploy(write_project(tmp_path / api, api, {"events": str(events)}))
    time.sleep(2)  # the node is idle: blocked in a BRPOP on its hardware queue for LONG_POLL_S

    job = client.submit(api, [1, 2, 3], batch_size=1)
    final = client.wait(api, job["job_id"], timeout=LONG_POLL_S / 4)

    assert final["status"] == "status_succeeded", final
    assert sorted(i for e in read_events(events) if e.get("event") == "predict" for i in e["items"]) == [1, 2, 3]
