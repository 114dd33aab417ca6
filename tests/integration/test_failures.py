"""When predictors raise, jobs are stopped or time out, or a worker dies, nothing is lost or run twice."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest
import redis

from jobs.batch.job import job_queue_name
from jobs.transport.broker import Channel
from sluice.client import Conflict

from .processes import children_of

pytestmark = pytest.mark.integration


def _wait_for(check, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _nothing_left_to_run(stack, job_id: str) -> bool:
    """No message of the job is queued (its queue, kombu's priority lists of it) and none is taken and
    unacknowledged: every batch that started has returned from predict (a node acknowledges a
    batch's message only after recording its outcome), and no further one can start."""
    client = redis.Redis.from_url(stack.redis_url)
    queued = sum(client.llen(key) for key in client.scan_iter(match=f"{job_queue_name(job_id)}*"))
    taken = [raw for raw in client.hvals(Channel.unacked_key) if job_id.encode() in raw]
    return queued == 0 and not taken


def test_a_raising_predictor_is_retried_then_its_batch_is_kept_as_failed(client, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "poison": 13})
    spec = client.submit(api, list(range(40)), batch_size=10, tries=3)

    final = client.wait(api, spec["job_id"], timeout=120)

    assert final["status"] == "status_completed_with_failures"
    assert final["batch_metrics"] == {**final["batch_metrics"], "succeeded": 3, "failed": 1}
    failed = client.failed_batches(api, spec["job_id"])
    assert len(failed) == 1
    assert failed[0]["index"] == 1
    assert failed[0]["tries"] == 3
    assert failed[0]["payload"] == list(range(10, 20))
    assert "ValueError: cannot handle item 13" in failed[0]["error"]
    seen = events(events_file)
    tries_of_failed_batch = [e for e in seen if e["event"] == "predict" and 13 in e["items"]]
    assert len(tries_of_failed_batch) == 3
    assert [e["event"] for e in seen].count("complete") == 1


def test_by_default_a_batch_gets_one_try(client, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "poison": 0})
    spec = client.submit(api, [0, 1], batch_size=1)

    final = client.wait(api, spec["job_id"], timeout=120)

    assert final["status"] == "status_completed_with_failures"
    assert len([e for e in events(events_file) if e["event"] == "predict" and e["items"] == [0]]) == 1


def test_a_constructor_that_raises_ends_the_job_with_a_worker_error(client, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "fail_init": True})
    spec = client.submit(api, list(range(50)), batch_size=5)

    final = client.wait(api, spec["job_id"], timeout=120)

    assert final["status"] == "status_worker_error"
    assert "RuntimeError: the model file is corrupt" in final["message"]
    assert [e for e in events(events_file) if e["event"] == "predict"] == []


def test_a_stopped_job_runs_no_further_batches_and_never_completes(client, stack, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "sleep": 0.2})
    spec = client.submit(api, list(range(100)), batch_size=2, workers=1)
    _wait_for(lambda: len(events(events_file)) >= 3, what="the first batches")

    answer = client.stop(api, spec["job_id"])

    assert answer == {"message": f"stopped job {spec['job_id']}"}
    status = client.job(api, spec["job_id"])
    assert status["status"] == "status_stopped"
    ran_at_stop = len([e for e in events(events_file) if e["event"] == "predict"])
    _wait_for(lambda: _nothing_left_to_run(stack, spec["job_id"]), what="the stopped job's batches to be gone")
    ran_later = [e for e in events(events_file) if e["event"] == "predict"]
    assert len(ran_later) <= ran_at_stop + 1  # at most the batch that was running
    assert len(ran_later) < 50
    assert "complete" not in [e["event"] for e in events(events_file)]
    with pytest.raises(Conflict) as stopped_twice:
        client.stop(api, spec["job_id"])
    assert "409" in str(stopped_twice.value)


def test_a_job_past_its_timeout_is_timed_out_by_beat(client, stack, deploy_project, events_file, events):
    api = deploy_project({"events": str(events_file), "sleep": 0.5})
    spec = client.submit(api, list(range(40)), batch_size=1, workers=1, timeout=2)

    final = client.wait(api, spec["job_id"], timeout=60)

    assert final["status"] == "status_timed_out"
    assert "timeout" in final["message"]
    _wait_for(lambda: _nothing_left_to_run(stack, spec["job_id"]), what="the timed-out job's batches to be gone")
    assert len([e for e in events(events_file) if e["event"] == "predict"]) < 40
    assert "complete" not in [e["event"] for e in events(events_file)]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGQUIT], ids=["killed", "cold shutdown"])
def test_a_worker_process_killed_mid_batch_leaves_the_batch_to_another_and_nothing_is_lost(
    client, stack, deploy_project, events_file, events, tmp_path, sig
):
    """Killed outright, or shut down cold (SIGQUIT, a second Ctrl-C): either way the batch it held is
    run by another node, once, and none is failed."""
    marker = tmp_path / "hanging.pid"
    api = deploy_project({"events": str(events_file), "hang_marker": str(marker), "hang_on": 300})
    spec = client.submit(api, list(range(1000)), batch_size=10, workers=2)
    pid = int(_wait_for(lambda: marker.exists() and marker.read_text(), what="the hanging batch"))
    [victim] = [c for c in stack.children if c.is_worker and c.process.pid == pid]

    os.kill(pid, sig)

    final = client.wait(api, spec["job_id"], timeout=180)
    assert final["status"] == "status_succeeded", final
    assert final["batch_metrics"]["succeeded"] == 100 and final["batch_metrics"]["failed"] == 0
    predicts = [e for e in events(events_file) if e["event"] == "predict"]
    assert sorted(item for e in predicts for item in e["items"]) == list(range(1000))
    assert set(Counter(e["batch_id"] for e in predicts).values()) == {1}
    hung_batch = [e for e in predicts if 300 in e["items"]]
    assert len(hung_batch) == 1 and hung_batch[0]["pid"] != pid
    # The node comes back, however it ended (a cold shutdown exits on its own, after the job may be done).
    _wait_for(lambda: victim.process.pid != pid and victim.process.poll() is None, what="the node to come back")


def test_a_job_whose_api_process_dies_mid_enqueue_is_failed_by_beat_and_runs_nothing(
    client, stack, deploy_project, events_file, events, tmp_path
):
    api = deploy_project({"events": str(events_file)})
    big = tmp_path / "big.jsonl"
    big.write_text("".join(f'{{"n": {i}}}\n' for i in range(200_000)))  # one task per line: a slow enqueue
    spec = client.submit_raw(api, {"delimited_files": {"s3_paths": [str(big)], "batch_size": 1}})
    assert client.job(api, spec["job_id"])["status"] == "status_enqueuing"

    api_server = next(c for c in stack.children if c.name == "api")
    for pid in children_of(api_server.process.pid):  # gunicorn's workers; its arbiter starts new ones
        os.kill(pid, signal.SIGKILL)

    final = client.wait(api, spec["job_id"], timeout=60)
    assert final["status"] == "status_enqueue_failed"
    assert "enqueueing stopped" in final["message"]
    _wait_for(lambda: _nothing_left_to_run(stack, spec["job_id"]), what="the failed job's batches to be gone")
    assert events(events_file) == []  # its input was never fully validated: nothing of it ran
