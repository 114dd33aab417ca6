"""A batch job walks from `POST /batch/<api>` to `on_job_complete` without calling back into a module it
has already left (the project's issue 17, item 3).

One process plays every part: the management app (Flask's test client), the enqueuer's thread, and a
worker node whose tasks are applied in-process to the messages the enqueuer published, as
`celery -A jobs worker` would run them; Redis is real. Every call into Sluice's own modules is traced
(`sys.setprofile`), and for each one the chain of Sluice modules on the stack is known: a call into a
module already on that chain below the caller is a call back. The modules the path crosses are
printed (`pytest -s`), for the record of how many it takes.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import redis
from kombu import Consumer, Queue

from foundation import figure_sink
from foundation.figures import Recorder
from foundation.log_streams import StreamLogHandler
from foundation.settings import Settings
from predictors_runtime.project import pack_project

FIRST_PARTY = ("sluice", "cortex", "api", "beat", "jobs", "predictors_runtime", "cortex_internal", "foundation")

PREDICTOR = '''
class PythonPredictor:
    def __init__(self, config, job_spec):
        self.config = config

    def predict(self, payload, batch_id):
        return [x * 2 for x in payload]

    def on_job_complete(self):
        with open(self.config["done"], "w") as f:
            f.write("on_job_complete ran")
'''


class Trace:
    """Calls into Sluice's modules: which were entered, the arrows between them, and the calls back."""

    def __init__(self) -> None:
        self.crossed: dict[str, None] = {}
        self.arrows: set[tuple[str, str]] = set()
        self.calls_back: dict[tuple[str, str], list[str]] = {}

    @staticmethod
    def _chain(frame: FrameType | None) -> list[str]:
        """The Sluice modules on the stack, outermost first, each once per stretch."""
        chain: list[str] = []
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.split(".")[0] in FIRST_PARTY and (not chain or chain[-1] != name):
                chain.append(name)
            frame = frame.f_back
        return chain[::-1]

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if name.split(".")[0] not in FIRST_PARTY:
            return
        self.crossed.setdefault(name)
        chain = self._chain(frame.f_back)
        if chain and chain[-1] != name:
            self.arrows.add((chain[-1], name))
            if name in chain[:-1]:
                self.calls_back.setdefault((chain[-1], name), [*chain, name])

    def __enter__(self) -> Trace:
        sys.setprofile(self)
        threading.setprofile(self)  # type: ignore[arg-type]
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def cycles(self) -> list[list[str]]:
        """Groups of modules that call each other round, by any path (Tarjan's strongly connected components)."""
        graph: dict[str, set[str]] = {}
        for a, b in self.arrows:
            graph.setdefault(a, set()).add(b)
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        found: list[list[str]] = []

        def visit(node: str) -> None:
            index[node] = low[node] = len(index)
            stack.append(node)
            for nxt in graph.get(node, ()):
                if nxt not in index:
                    visit(nxt)
                    low[node] = min(low[node], low[nxt])
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))

        for node in list(graph):
            if node not in index:
                visit(node)
        return found


def take_all(celery: Any, queue: str) -> list[tuple[dict[str, Any], Any]]:
    """Every message on a job's queue (headers, body), acknowledged: a node takes them one by one."""
    taken: list[tuple[dict[str, Any], Any]] = []
    with celery.connection_for_write() as conn:
        def on_message(body: Any, message: Any) -> None:
            taken.append((message.headers, body))
            message.ack()

        with Consumer(conn, [Queue(queue, routing_key=queue)], callbacks=[on_message]):
            try:
                while True:
                    conn.drain_events(timeout=0.5)
            except TimeoutError:
                pass
    return taken


@pytest.fixture
def settings(redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> Iterator[Settings]:
    yield Settings(redis_url=redis_server.rsplit("/", 1)[0] + "/1", storage=str(tmp_path / "storage"),
                   cache_dir=str(tmp_path / "cache"))
    for handler in [h for h in logging.getLogger().handlers if isinstance(h, StreamLogHandler)]:
        logging.getLogger().removeHandler(handler)  # the worker runtime's, installed on its first task
        handler.close()
    recorder = figure_sink.installed()
    if isinstance(recorder, Recorder):
        recorder.close()
    figure_sink.install(None)


def test_a_batch_job_reaches_on_job_complete_without_calling_back_into_a_module_it_left(
    settings: Settings, tmp_path: Path
) -> None:
    from api.app import create_app
    from jobs.celery_app import create_celery

    project = tmp_path / "project"
    project.mkdir()
    (project / "cortex.yaml").write_text(
        "- name: doubler\n  kind: BatchAPI\n  predictor:\n    type: python\n    path: predictor.py\n"
        f"    config: {{done: {tmp_path / 'done'}}}\n")
    (project / "predictor.py").write_text(PREDICTOR)
    app = create_app(settings)
    worker = create_celery(settings)  # the worker node's app, as `celery -A jobs worker` makes it
    client = app.test_client()
    deployed = client.post("/apis", content_type="multipart/form-data", data={
        "config": (io.BytesIO((project / "cortex.yaml").read_bytes()), "cortex.yaml"),
        "project": (io.BytesIO(pack_project(project)), "project.tgz")})
    assert deployed.status_code in (200, 201), deployed.get_json()

    def walk(trace: Trace) -> str:
        """Submit a job and run its tasks, tracing the parts Sluice plays; returns the job's id."""
        with trace:
            answer = client.post("/batch/doubler", json={"item_list": {"items": [1, 2, 3], "batch_size": 2}})
            job_id: str = answer.get_json()["job_id"]
            for thread in threading.enumerate():
                if thread.name == f"enqueue-{job_id}":
                    thread.join()
        batches = take_all(worker, f"job.{job_id}")
        with trace:
            deliver(batches)
        completion = take_all(worker, f"job.{job_id}")
        with trace:
            deliver(completion)
        assert [headers["task"] for headers, _ in batches + completion] == [
            "sluice.run_batch", "sluice.run_batch", "sluice.finish_job"]
        return job_id

    def deliver(messages: list[tuple[dict[str, Any], Any]]) -> None:
        for headers, body in messages:
            worker.tasks[headers["task"]].apply(args=body[0], task_id=headers["id"], hostname="node@trace")

    first, second = Trace(), Trace()  # a fresh node's first job (it wires itself up), then its next
    job_ids = [walk(first), walk(second)]
    app.extensions["sluice.figures"].close()

    assert (tmp_path / "done").read_text() == "on_job_complete ran"
    for job_id in job_ids:
        assert client.get(f"/batch/doubler?jobID={job_id}").get_json()["job_status"]["status"] == "status_succeeded"
    for trace, which in [(first, "a fresh node's first job"), (second, "the next job")]:
        print(f"\n{which}: {len(trace.crossed)} modules crossed from POST /batch/<api> to on_job_complete:")
        print("\n".join(f"  {name}" for name in sorted(trace.crossed)))
        assert trace.calls_back == {}, "\n".join(" > ".join(chain) for chain in trace.calls_back.values())
        assert trace.cycles() == []
