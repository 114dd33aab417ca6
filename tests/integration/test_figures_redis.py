"""Figures in Redis as `/metrics` shows them: summed over every process, jobs counted by the job
store's own script, queue depths read from the broker (`foundation/figures.py`, `api/metrics.py`).

Each `Recorder` stands for one process; they share a real Redis as Sluice's processes do, and
`/metrics`' text is parsed back with prometheus-client's own parser.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import exposition, queue_depths
from foundation.figure_store import RedisFigureStore
from foundation.figures import JOBS, RealtimeFigures, Recorder, read_figures
from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus, job_queue_name
from jobs.celery_app import create_celery
from jobs.services import Services
from jobs.store import JobStore

Parsed = dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]


@pytest.fixture
def url(redis_client: redis.Redis) -> str:
    kwargs = redis_client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"


@pytest.fixture
def services(url: str) -> Services:
    settings = Settings(redis_url=url)
    return Services.connect(settings, create_celery(settings))


def scrape(services: Services) -> Parsed:
    """/metrics' text parsed: family name -> (sample name, sorted labels) -> value."""
    parsed: Parsed = {}
    for family in text_string_to_metric_families(exposition(services).decode()):
        samples = parsed.setdefault(family.name, {})
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return parsed


def test_metrics_shows_the_totals_of_every_process_in_prometheus_text(
    redis_client: redis.Redis, services: Services,
) -> None:
    store = RedisFigureStore(redis_client)
    replica_a, replica_b = Recorder(store), Recorder(store)
    RealtimeFigures(replica_a, "iris").answered(200, 0.02)
    RealtimeFigures(replica_b, "iris").answered(200, 0.2)
    RealtimeFigures(replica_b, "iris").answered(503, 0.001)
    replica_a.flush()
    replica_b.flush()
    metrics = scrape(services)
    requests = metrics["sluice_realtime_requests"]
    assert requests[("sluice_realtime_requests_total", (("api", "iris"), ("code", "200")))] == 2
    assert requests[("sluice_realtime_requests_total", (("api", "iris"), ("code", "503")))] == 1
    rejected = metrics["sluice_realtime_rejected"]
    assert rejected == {("sluice_realtime_rejected_total", (("api", "iris"), ("reason", "not_ready"))): 1}
    latency = metrics["sluice_realtime_request_duration_seconds"]
    assert latency[("sluice_realtime_request_duration_seconds_count", (("api", "iris"),))] == 3
    assert latency[("sluice_realtime_request_duration_seconds_bucket", (("api", "iris"), ("le", "0.025")))] == 2
    assert latency[("sluice_realtime_request_duration_seconds_bucket", (("api", "iris"), ("le", "+Inf")))] == 3
    assert latency[("sluice_realtime_request_duration_seconds_sum", (("api", "iris"),))] == pytest.approx(0.221)
    for name in ("sluice_jobs", "sluice_batches", "sluice_items", "sluice_batch_duration_seconds",
                 "sluice_realtime_batch_size", "sluice_model_loads", "sluice_model_load_seconds", "sluice_queue_depth"):
        assert name in metrics


def test_a_job_that_ends_is_counted_once_by_its_final_status(redis_client: redis.Redis, services: Services) -> None:
    store = JobStore(redis_client, job_ttl_s=60)
    job = Job(job_id="job-1", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=1,
              start_time=1.0, api_spec={"name": "iris"}, bundle="b", hardware_queue="cpu", tries=1)
    other = dataclasses.replace(job, job_id="job-2")
    store.create(job, JobStatus.RUNNING)
    store.create(other, JobStatus.RUNNING)
    assert store.transition(job.job_id, JobStatus.SUCCEEDED)
    assert not store.transition(job.job_id, JobStatus.WORKER_ERROR)  # ended already: not counted again
    assert store.transition(other.job_id, JobStatus.STOPPED)
    assert read_figures(RedisFigureStore(redis_client))[JOBS.name] == {("iris", "succeeded"): 1, ("iris", "stopped"): 1}
    jobs = scrape(services)["sluice_jobs"]
    assert jobs[("sluice_jobs_total", (("api", "iris"), ("status", "succeeded")))] == 1


def test_queue_depth_counts_the_queues_of_active_jobs_under_their_hardware_queue(
    redis_client: redis.Redis, services: Services,
) -> None:
    job = Job(job_id="job-q", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=3,
              start_time=1.0, api_spec={"name": "iris"}, bundle="b", hardware_queue="gpu", tries=1)
    services.store.create(job, JobStatus.RUNNING)
    redis_client.rpush(job_queue_name(job.job_id), "m1", "m2", "m3")
    redis_client.rpush("cpu", "m4")
    assert queue_depths(services) == {"cpu": 1, "gpu": 3, "inf": 0}
    depth = scrape(services)["sluice_queue_depth"]
    assert depth[("sluice_queue_depth", (("queue", "gpu"),))] == 3
