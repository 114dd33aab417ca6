"""Figures counted in many processes and read back as one total (`foundation/figures.py`, `api/metrics.py`).

Each `Recorder` stands for one process; they share a real Redis as Sluice's processes do, and
`/metrics`' text is parsed back with prometheus-client's own parser.
"""

from __future__ import annotations

import dataclasses

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from api.metrics import exposition, queue_depths
from foundation import figures
from jobs.celery_app import create_celery
from foundation.figures import (
    BATCH_SECONDS,
    BATCHES,
    ITEMS,
    JOBS,
    REALTIME_REQUESTS,
    RealtimeFigures,
    Recorder,
    read_figures,
)
from jobs.job import Job, JobStatus, job_queue_name
from jobs.services import Services
from foundation.settings import Settings
from jobs.store import JobStore
from foundation import figure_sink as process_figures
from sluice.proxy_rejections import RejectionTally, parse_table


@pytest.fixture
def url(redis_client: redis.Redis) -> str:
    kwargs = redis_client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs['db']}"


def scrape(services: Services) -> dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """/metrics' text parsed: family name -> (sample name, sorted labels) -> value."""
    parsed: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in text_string_to_metric_families(exposition(services).decode()):
        samples = parsed.setdefault(family.name, {})
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return parsed


@pytest.fixture
def services(url: str) -> Services:
    settings = Settings(redis_url=url)
    return Services.connect(settings, create_celery(settings))


def test_counts_of_two_processes_add_up_to_one_total(redis_client):
    first, second = Recorder(redis_client), Recorder(redis_client)
    first.counter(BATCHES, "iris", "succeeded").inc()
    first.counter(BATCHES, "iris", "succeeded").inc(2)
    second.counter(BATCHES, "iris", "succeeded").inc(4)
    second.counter(BATCHES, "iris", "failed").inc()
    second.count(ITEMS.name, ("iris",), 50)
    assert first.flush() and second.flush()
    first.counter(BATCHES, "iris", "succeeded").inc()  # counted after the flush: sent by the next one
    totals = read_figures(redis_client)
    assert totals[BATCHES.name] == {("iris", "succeeded"): 7, ("iris", "failed"): 1}
    assert totals[ITEMS.name] == {("iris",): 50}
    assert first.flush()
    assert read_figures(redis_client)[BATCHES.name][("iris", "succeeded")] == 8


def test_a_flush_sends_each_count_once(redis_client):
    recorder = Recorder(redis_client)
    recorder.counter(ITEMS, "iris").inc(3)
    assert recorder.flush() and recorder.flush() and recorder.flush()
    assert read_figures(redis_client)[ITEMS.name] == {("iris",): 3}


def test_histograms_of_two_processes_are_summed_into_cumulative_buckets(redis_client):
    bounds = BATCH_SECONDS.buckets
    first, second = Recorder(redis_client), Recorder(redis_client)
    for value in (0.001, bounds[0], 0.3):  # a bucket's own bound belongs to it (le means <=)
        first.histogram(BATCH_SECONDS, "iris").observe(value)
    for value in (0.3, 10_000.0):  # beyond the last bound: only in +Inf
        second.histogram(BATCH_SECONDS, "iris").observe(value)
    first.flush()
    second.flush()
    [(labels, totals)] = read_figures(redis_client)[BATCH_SECONDS.name].items()
    assert labels == ("iris",)
    buckets = dict(totals.buckets)
    assert list(buckets) == [repr(b) for b in bounds] + ["+Inf"]
    assert buckets[repr(bounds[0])] == 2
    assert buckets["0.25"] == 2 and buckets["0.5"] == 4
    assert buckets[repr(bounds[-1])] == 4 and buckets["+Inf"] == 5 == totals.count
    assert totals.sum == pytest.approx(0.001 + bounds[0] + 0.3 + 0.3 + 10_000.0)
    counts = list(buckets.values())
    assert counts == sorted(counts)  # cumulative


def test_metrics_shows_the_totals_in_prometheus_text(redis_client, services):
    replica_a, replica_b = Recorder(redis_client), Recorder(redis_client)
    RealtimeFigures(replica_a, "iris").answered(200, 0.02)
    RealtimeFigures(replica_b, "iris").answered(200, 0.2)
    RealtimeFigures(replica_b, "iris").answered(503, 0.001)
    replica_a.flush()
    replica_b.flush()
    metrics = scrape(services)
    requests = metrics["sluice_realtime_requests"]
    assert requests[("sluice_realtime_requests_total", (("api", "iris"), ("code", "200")))] == 2
    assert requests[("sluice_realtime_requests_total", (("api", "iris"), ("code", "503")))] == 1
    # a replica's own 503 is a refusal: its predictor was not built
    rejected = metrics["sluice_realtime_rejected"]
    assert rejected == {("sluice_realtime_rejected_total", (("api", "iris"), ("reason", "not_ready"))): 1}
    latency = metrics["sluice_realtime_request_duration_seconds"]
    assert latency[("sluice_realtime_request_duration_seconds_count", (("api", "iris"),))] == 3
    assert latency[("sluice_realtime_request_duration_seconds_bucket", (("api", "iris"), ("le", "0.025")))] == 2
    assert latency[("sluice_realtime_request_duration_seconds_bucket", (("api", "iris"), ("le", "+Inf")))] == 3
    assert latency[("sluice_realtime_request_duration_seconds_sum", (("api", "iris"),))] == pytest.approx(0.221)
    # every figure is there, counted or not yet
    for name in ("sluice_jobs", "sluice_batches", "sluice_items", "sluice_batch_duration_seconds",
                 "sluice_realtime_batch_size", "sluice_model_loads", "sluice_model_load_seconds", "sluice_queue_depth"):
        assert name in metrics


def test_a_job_that_ends_is_counted_once_by_its_final_status(redis_client, services):
    store = JobStore(redis_client, job_ttl_s=60)
    job = Job(job_id="job-1", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=1,
              start_time=1.0, api_spec={"name": "iris"}, bundle="b", hardware_queue="cpu", tries=1)
    other = dataclasses.replace(job, job_id="job-2")
    store.create(job, JobStatus.RUNNING)
    store.create(other, JobStatus.RUNNING)
    assert store.transition(job.job_id, JobStatus.SUCCEEDED)
    assert not store.transition(job.job_id, JobStatus.WORKER_ERROR)  # ended already: not counted again
    assert store.transition(other.job_id, JobStatus.STOPPED)
    assert read_figures(redis_client)[JOBS.name] == {("iris", "succeeded"): 1, ("iris", "stopped"): 1}
    jobs = scrape(services)["sluice_jobs"]
    assert jobs[("sluice_jobs_total", (("api", "iris"), ("status", "succeeded")))] == 1


def test_queue_depth_counts_the_queues_of_active_jobs_under_their_hardware_queue(redis_client, services):
    store = services.store
    job = Job(job_id="job-q", api_name="iris", workers=1, config={}, timeout=None, total_batch_count=3,
              start_time=1.0, api_spec={"name": "iris"}, bundle="b", hardware_queue="gpu", tries=1)
    store.create(job, JobStatus.RUNNING)
    redis_client.rpush(job_queue_name(job.job_id), "m1", "m2", "m3")
    redis_client.rpush("cpu", "m4")
    assert queue_depths(services) == {"cpu": 1, "gpu": 3, "inf": 0}
    depth = scrape(services)["sluice_queue_depth"]
    assert depth[("sluice_queue_depth", (("queue", "gpu"),))] == 3


def test_the_process_sink_reaches_the_installed_recorder_and_nothing_without_one(redis_client):
    recorder = Recorder(redis_client)
    process_figures.install(None)
    process_figures.count(figures.MODEL_LOADS.name, ("iris", "_default"))  # dropped
    process_figures.install(recorder)
    try:
        process_figures.count(figures.MODEL_LOADS.name, ("iris", "_default"))
        process_figures.observe(figures.MODEL_LOAD_SECONDS.name, ("iris",), 1.5)
    finally:
        process_figures.install(None)
    recorder.flush()
    totals = read_figures(redis_client)
    assert totals[figures.MODEL_LOADS.name] == {("iris", "_default"): 1}
    assert totals[figures.MODEL_LOAD_SECONDS.name][("iris",)].count == 1


def test_a_failed_flush_keeps_its_counts_for_the_next(redis_client, url):
    from sluice.embedded import free_port

    nowhere = Recorder(redis.Redis(port=free_port(), socket_connect_timeout=1))
    nowhere.counter(REALTIME_REQUESTS, "iris", "200").inc(5)
    nowhere.histogram(BATCH_SECONDS, "iris").observe(1.0)
    assert nowhere.flush() is False
    nowhere._client = redis_client  # Redis is back
    assert nowhere.flush() is True
    totals = read_figures(redis_client)
    assert totals[REALTIME_REQUESTS.name] == {("iris", "200"): 5}
    assert totals[BATCH_SECONDS.name][("iris",)].count == 1


def test_label_values_of_any_text_survive_the_round_trip(redis_client):
    recorder = Recorder(redis_client)
    recorder.counter(figures.MODEL_LOADS, 'we|ird "api"', "mo/del\n").inc()
    recorder.flush()
    assert read_figures(redis_client)[figures.MODEL_LOADS.name] == {('we|ird "api"', "mo/del\n"): 1}


def test_a_series_needs_exactly_the_figures_labels(redis_client):
    with pytest.raises(ValueError):
        Recorder(redis_client).counter(BATCHES, "iris")


# -- the proxy's own answers ---------------------------------------------------------------------------
TABLE_TEXT = """# table: sluice_rejected, type: string, size:10240, used:2
0x55d7cc029c38: key=iris use=0 exp=0 gpc0=2 gpc1=0 gpc2=3 gpc3=0 gpc4=1
0x55d7cc029c99: key=other-api use=1 exp=0 gpc0=0 gpc1=1 gpc2=0 gpc3=0 gpc4=0
"""


def test_the_refusals_table_is_read_per_api_in_reason_order():
    assert parse_table(TABLE_TEXT) == {"iris": [2, 0, 3, 0, 1], "other-api": [0, 1, 0, 0, 0]}
    assert parse_table("No such table\n") == {}


def test_only_growth_is_counted_and_a_new_worker_counts_from_zero():
    tally = RejectionTally()
    assert tally.update({10: {"iris": [2, 0, 3, 0, 0]}}) == {("iris", "overloaded"): 2, ("iris", "request_timeout"): 3}
    assert tally.update({10: {"iris": [2, 0, 3, 0, 0]}}) == {}
    # a reload: the old worker (10) still answers a little, the new one (11) starts at zero
    assert tally.update({10: {"iris": [3, 0, 3, 0, 0]}, 11: {"iris": [1, 1, 0, 0, 0]}}) == {
        ("iris", "overloaded"): 2, ("iris", "not_ready"): 1}
    tally.forget_except({11})
    assert tally.update({11: {"iris": [1, 1, 0, 0, 0]}}) == {}
