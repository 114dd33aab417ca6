"""Chaos: ten jobs while worker nodes are SIGKILLed and Redis stalls (SIGSTOP/SIGCONT, up to 6 s, past
the 5 s socket timeout of Sluice's Redis clients) at random moments (while a job is submitted and
enqueued, mid-run, during its last batch, during its completion). Every job must end, every batch
be recorded once, every `on_job_complete` run once.

The run is drawn from a seed (printed; `SLUICE_CHAOS_SEED` replays one), and bounded: it ends in
well under two minutes, or fails.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Client, ClientError
from sluice.embedded import Stack, free_port

from .conftest import FAST_LOOPS, ROOM, closing_client, read_events, write_project
from .redis_process import FAULTS_PREDICTOR, RedisProcess, read_marker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = int(os.environ.get("SLUICE_CHAOS_SEED", "20251010"))
JOBS = 10
NODES = 3
KILLS = 4
# Stalls within the clients' socket timeout (5 s: a command waits) and past it (a reply is lost, the
# command still runs), the longest a second past it.
MIN_STALL_S, MAX_STALL_S = 2.0, 6.0
# Jobs are submitted within the first SUBMIT_WITHIN_S of the run and nodes killed within KILL_WITHIN_S:
# the stalls stretch the run well past both, so that kills and stalls fall on every phase of the jobs.
SUBMIT_WITHIN_S, KILL_WITHIN_S = 10.0, 15.0
MOMENTS = ("enqueue", "mid-run", "last batch", "completion")
DEADLINE_S = 100.0  # from the first submission to every job ended
TERMINAL = {"status_succeeded", "status_completed_with_failures", "status_enqueue_failed", "status_worker_error",
            "status_worker_oom", "status_timed_out", "status_stopped", "status_unexpected_error"}


@dataclass
class PlannedJob:
    number: int
    items: list[int]
    batch_size: int
    workers: int
    sleep: float
    submit_after: float  # seconds after the chaos starts
    moment: str | None  # when Redis stalls for this job, if ever
    stall_s: float
    job_id: str = ""

    @property
    def batches(self) -> int:
        return -(-len(self.items) // self.batch_size)


@dataclass
class Chaos:
    """The plan drawn from the seed, and what actually happened."""

    jobs: list[PlannedJob]
    kills_after: list[float]  # seconds after the chaos starts
    killed: dict[int, float] = field(default_factory=dict)  # pid -> seconds after start
    stalls: list[tuple[str, float, float]] = field(default_factory=list)  # (why, start, seconds)


def draw(rng: random.Random) -> Chaos:
    moments = list(MOMENTS) + rng.choices([*MOMENTS, None, None], k=JOBS - len(MOMENTS))
    rng.shuffle(moments)
    jobs = []
    for number, moment in enumerate(moments):
        count = rng.randint(20, 50)
        jobs.append(PlannedJob(
            number=number,
            items=list(range(number * 1000, number * 1000 + count)),
            batch_size=rng.randint(1, 4),
            # The last batch is last only on one node; on_job_complete sees all items only on one.
            workers=1 if moment in ("last batch", "completion") else rng.randint(1, 2),
            sleep=round(rng.uniform(0.02, 0.1), 3),
            submit_after=round(rng.uniform(0, SUBMIT_WITHIN_S), 2),
            moment=moment,
            stall_s=round(rng.uniform(MIN_STALL_S, MAX_STALL_S), 1),
        ))
    kills_after = sorted(rng.uniform(2, KILL_WITHIN_S) for _ in range(KILLS))
    return Chaos(jobs=sorted(jobs, key=lambda j: j.submit_after), kills_after=kills_after)


@pytest.fixture(scope="module")
def redis_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    process = RedisProcess(tmp_path_factory.mktemp("chaos-redis")).start()
    yield process
    process.close()


@pytest.fixture(scope="module")
def stack(redis_process: RedisProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    env = {**FAST_LOOPS, "SLUICE_ENQUEUE_STALE_AFTER": "60"}
    with Stack(port=free_port(), offers=ROOM, workers=NODES, redis_url=redis_process.url,
               data_dir=tmp_path_factory.mktemp("chaos-stack"), env=env) as running:
        yield running
        redis_process.resume()
        print(running.logs())


def _status(client: Client, api: str, job_id: str) -> dict[str, Any] | None:
    """The job's status, or None while the API cannot answer (it shares the stalled Redis)."""
    try:
        return client.job(api, job_id)
    except ClientError as e:
        if 0 < e.http_status < 500:
            raise
        return None


def test_jobs_survive_random_node_kills_and_redis_stalls(  # noqa: C901 - the storm, then what must hold after it
    stack: Stack, redis_process: RedisProcess, tmp_path: Path
) -> None:
    began = time.monotonic()
    rng = random.Random(SEED)
    chaos = draw(rng)
    print(f"\nchaos seed {SEED} (replay with SLUICE_CHAOS_SEED={SEED})")
    for job in chaos.jobs:
        print(f"  job {job.number}: {len(job.items)} items in batches of {job.batch_size} on {job.workers} node(s), "
              f"submitted at +{job.submit_after}s, Redis stalls {job.stall_s}s at: {job.moment or 'never'}")
    print(f"  node kills at +{', +'.join(f'{t:.1f}' for t in chaos.kills_after)}s")

    client = closing_client(stack.url, timeout=120)
    api = f"chaos-{uuid.uuid4().hex[:8]}"
    client.deploy(write_project(tmp_path / api, api, source=FAULTS_PREDICTOR))
    events = {job.number: tmp_path / f"events-{job.number}.jsonl" for job in chaos.jobs}
    start = time.monotonic()

    def at(seconds: float) -> None:
        time.sleep(max(start + seconds - time.monotonic(), 0))

    def stall(why: str, seconds: float) -> threading.Thread:
        chaos.stalls.append((why, round(time.monotonic() - start, 1), seconds))
        return redis_process.stall_in_background(seconds)

    def submit_all() -> None:
        for job in chaos.jobs:
            at(job.submit_after)
            config = {"events": str(events[job.number]), "sleep": job.sleep, "redis_pid": redis_process.pid,
                      "stall_s": job.stall_s, "stall_marker": str(tmp_path / f"stall-{job.number}")}
            if job.moment == "last batch":
                config["stall_redis_after"] = job.items[-1]
            if job.moment == "completion":
                config["stall_in_complete"] = True
            if job.moment == "enqueue":
                stall(f"job {job.number} enqueue", job.stall_s)  # the submission waits on Redis
            job.job_id = client.submit(api, job.items, batch_size=job.batch_size, workers=job.workers,
                                       config=config)["job_id"]
            if job.moment == "mid-run":
                threading.Thread(target=stall_mid_run, args=(job,), daemon=True).start()

    def stall_mid_run(job: PlannedJob) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if sum(e["event"] == "done" for e in read_events(events[job.number])) >= job.batches // 2:
                stall(f"job {job.number} mid-run", job.stall_s)
                return
            time.sleep(0.02)

    def kill_nodes() -> None:
        for after in chaos.kills_after:
            at(after)
            while redis_process.paused:  # a node killed while Redis is stopped would add nothing
                time.sleep(0.05)
            nodes = [child for child in stack.children if child.is_worker and child.process.poll() is None]
            if not nodes:
                continue
            process = rng.choice(nodes).process
            os.kill(process.pid, signal.SIGKILL)
            process.wait()  # gone before the next kill chooses among the living: every kill ends a node
            chaos.killed[process.pid] = round(time.monotonic() - start, 1)

    threads = [threading.Thread(target=submit_all, name="submitter"),
               threading.Thread(target=kill_nodes, name="killer")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=DEADLINE_S)

    finals: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(finals) < len(chaos.jobs) and time.monotonic() < deadline:
        for job in chaos.jobs:
            if job.number not in finals and job.job_id:
                status = _status(client, api, job.job_id)
                if status is not None and status["status"] in TERMINAL:
                    finals[job.number] = status
        time.sleep(0.2)
    wall = time.monotonic() - began
    for job in chaos.jobs:
        marker = read_marker(tmp_path / f"stall-{job.number}")
        if marker is not None:
            chaos.stalls.append((f"job {job.number} {marker['why']} (by its predictor)",
                                 round(marker["at"] - (time.time() - (time.monotonic() - start)), 1), job.stall_s))
    print(f"  stalls (why, at +s, seconds): {sorted(chaos.stalls, key=lambda s: s[1])}")
    print(f"  killed node pids (pid: at +s): {chaos.killed}")
    print(f"  chaos test wall time: {wall:.1f}s; jobs ended: {len(finals)} of {len(chaos.jobs)}")

    assert len(chaos.killed) == KILLS, f"nodes killed: {chaos.killed}"
    stranded = [job.number for job in chaos.jobs if job.number not in finals]
    assert not stranded, f"jobs {stranded} never ended (seed {SEED})"
    for job in chaos.jobs:
        final, seen = finals[job.number], read_events(events[job.number])
        assert final["status"] == "status_succeeded", (job, final)
        assert final["batch_metrics"]["succeeded"] == job.batches and final["batch_metrics"]["failed"] == 0
        done: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in seen:
            if event["event"] == "done":
                done[event["batch_id"]].append(event)
        ran = Counter(item for runs in done.values() for item in runs[0]["items"])
        assert ran == Counter(job.items), f"job {job.number}: every item runs, once"
        for batch_id, runs in done.items():
            # A batch ran again only if the node that ran it was killed before its outcome was recorded.
            assert all(run["pid"] in chaos.killed for run in runs[:-1]), (job.number, batch_id, runs)
        assert sum(e["event"] == "complete" for e in seen) == 1, f"job {job.number}: on_job_complete once"
