"""The batch time limit: a try past `batch_timeout`, or a batch whose job ended, ends the node's process."""

from __future__ import annotations

import threading

import pytest

from foundation.errors import ConfigError
from foundation.settings import Settings
from jobs.batch.job import Job, JobStatus
from jobs.batch.time_limit import EXIT_STOPPED_BATCH, BatchWatchdog, batch_time_limit
from jobs.store.memory import MemoryJobStore

T0 = 1_700_000_000.0


class Sent(list[tuple[str, str]]):
    """Stands in for sending a job's completion task: remembers (job id, queue)."""

    def __call__(self, job_id: str, queue: str) -> None:
        self.append((job_id, queue))


class Ending:
    """Stands in for `os._exit`: remembers the exit status and lets the test go on."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.event = threading.Event()

    def __call__(self, status: int) -> None:
        self.status = status
        self.event.set()


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()  # it keeps the job store's contract (tests/contracts/job_store.py)


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def ending() -> Ending:
    return Ending()


@pytest.fixture
def watchdog(store: MemoryJobStore, sent: Sent, ending: Ending) -> BatchWatchdog:
    # No SIGALRM hard stop inside the test runner's process.
    return BatchWatchdog(store, store, sent, status_poll_s=0.05, end_process=ending, hard_stop_grace_s=None)


def submit(store: MemoryJobStore, job_id: str, batch_timeout: float | None, tries: int = 1,
           total: int = 2) -> Job:
    job = Job(job_id=job_id, api_name="iris", workers=1, config={}, timeout=None, total_batch_count=total,
              start_time=T0, tries=tries, batch_timeout=batch_timeout)
    store.create(job, JobStatus.RUNNING)
    return job


def test_a_try_past_the_limit_is_counted_and_the_process_ended_so_the_batch_is_tried_again(
    store: MemoryJobStore, watchdog: BatchWatchdog, ending: Ending
) -> None:
    job = submit(store, "hung", batch_timeout=0.2, tries=2)

    with watchdog.running(job, 0, attempt=1, payload=[1, 2]):
        assert ending.event.wait(10), "the watchdog never ended the hung batch"

    assert ending.status == EXIT_STOPPED_BATCH
    assert watchdog.tries_timed_out(job, 0) == 1
    assert store.failed_batches("hung") == []  # one try left: given back, not failed


def test_the_last_try_past_the_limit_fails_the_batch_and_the_job_goes_on(
    store: MemoryJobStore, watchdog: BatchWatchdog, ending: Ending, sent: Sent
) -> None:
    job = submit(store, "hung", batch_timeout=0.2, tries=2, total=1)
    store.seal("hung", 1)

    with watchdog.running(job, 0, attempt=2, payload=[1, 2]):
        assert ending.event.wait(10)

    failed = store.failed_batches("hung")
    assert [(f["index"], f["tries"], f["error"], f["payload"]) for f in failed] == [
        (0, 2, "timed out after 0.2 s", [1, 2])]
    assert sent == [("hung", "job.hung")]  # its last batch: its completion is sent


def test_a_batch_whose_job_is_stopped_is_ended(
    store: MemoryJobStore, watchdog: BatchWatchdog, ending: Ending
) -> None:
    job = submit(store, "stopped", batch_timeout=None)

    with watchdog.running(job, 3, attempt=1, payload=[7]):
        store.transition("stopped", JobStatus.STOPPED)
        assert ending.event.wait(10)

    assert ending.status == EXIT_STOPPED_BATCH
    assert store.failed_batches("stopped") == []


def test_building_a_predictor_for_a_job_that_times_out_is_ended(
    store: MemoryJobStore, watchdog: BatchWatchdog, ending: Ending
) -> None:
    job = submit(store, "slow-build", batch_timeout=None)

    with watchdog.while_active(job, 0):
        store.transition("slow-build", JobStatus.TIMED_OUT)
        assert ending.event.wait(10)


def test_batches_that_finish_in_time_are_left_alone(
    store: MemoryJobStore, watchdog: BatchWatchdog, ending: Ending
) -> None:
    job = submit(store, "quick", batch_timeout=0.3)
    for index in range(20):
        with watchdog.running(job, index, attempt=1, payload=[index]):
            pass
    with watchdog.running(job, 20, attempt=1, payload=[20]):
        ending.event.wait(0.15)  # a batch a little slower than the status poll, still in time

    assert not ending.event.wait(0.5)  # between batches nothing is watched, however long
    assert watchdog.tries_timed_out(job, 0) == 0


def test_the_limit_is_the_jobs_else_the_apis_else_sluices() -> None:
    api = {"predictor": {"batch_timeout": 30}}

    assert batch_time_limit(5, api, Settings(batch_timeout_s=60)) == 5
    assert batch_time_limit(None, api, Settings(batch_timeout_s=60)) == 30
    assert batch_time_limit(None, {"predictor": {}}, Settings(batch_timeout_s=60)) == 60
    assert batch_time_limit(None, {"predictor": {}}, Settings()) is None


def test_batch_timeout_is_bounded_wherever_it_is_given() -> None:
    from foundation.errors import BadRequest, ConfigError
    from jobs.batch.submission import parse_job_request
    from predictors_runtime.config import parse_api_configs

    job = {"item_list": {"items": [1], "batch_size": 1}}
    assert parse_job_request({**job, "batch_timeout": 2.5}).batch_timeout == 2.5
    for bad in (0, -1, 86_401, 10**401, 1e400):
        with pytest.raises(BadRequest, match="batch_timeout"):
            parse_job_request({**job, "batch_timeout": bad})

    api = "- name: iris\n  kind: BatchAPI\n  predictor: {{path: predictor.py, batch_timeout: {}}}\n"
    assert parse_api_configs(api.format(30))[0].predictor.batch_timeout == 30
    with pytest.raises(ConfigError, match="predictor.batch_timeout"):
        parse_api_configs(api.format(86_401))

    assert Settings.from_env({"SLUICE_BATCH_TIMEOUT": "90"}).batch_timeout_s == 90
    assert Settings.from_env({}).batch_timeout_s is None
    for bad in ("0", "1e400", "soon"):
        with pytest.raises(ConfigError, match="SLUICE_BATCH_TIMEOUT"):
            Settings.from_env({"SLUICE_BATCH_TIMEOUT": bad})


def test_a_hook_past_its_time_limit_is_recorded_then_its_process_ended() -> None:
    from jobs.batch.time_limit import hook_time_limit

    ended, recorded, release = [], [], threading.Event()

    def end_process(code: int) -> None:
        ended.append(code)
        release.set()  # in a node the process is gone here; the test lets the hook return instead

    with hook_time_limit(0.2, lambda: recorded.append("timed out"), end_process):
        assert release.wait(10), "the watchdog never fired"
    assert recorded == ["timed out"] and ended == [EXIT_STOPPED_BATCH]


def test_a_hook_within_its_time_limit_or_without_one_is_left_alone() -> None:
    from jobs.batch.time_limit import hook_time_limit

    calls: list[str] = []
    with hook_time_limit(30, lambda: calls.append("expired"), lambda code: calls.append(f"exit {code}")):
        pass
    with hook_time_limit(None, lambda: calls.append("expired"), lambda code: calls.append(f"exit {code}")):
        pass
    assert calls == []


def test_the_kernel_hard_stop_comes_the_configured_grace_after_the_limit(
    store: MemoryJobStore, sent: Sent, ending: Ending, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A predictor holding the GIL starves the watchdog: SIGALRM ends the node `SLUICE_HARD_STOP_GRACE_S` later."""
    import jobs.batch.time_limit as time_limit

    alarms: list[int] = []
    monkeypatch.setattr(time_limit.signal, "alarm", lambda seconds: alarms.append(seconds) or 0)
    monkeypatch.setattr(time_limit.signal, "getsignal", lambda signum: time_limit.signal.SIG_DFL)  # as in a node
    assert Settings.from_env({}).hard_stop_grace_s == 5
    grace = Settings.from_env({"SLUICE_HARD_STOP_GRACE_S": "2"}).hard_stop_grace_s
    watchdog = BatchWatchdog(store, store, sent, status_poll_s=0.05, end_process=ending, hard_stop_grace_s=grace)
    job = submit(store, "j-grace", batch_timeout=1.5)

    with watchdog.running(job, index=0, attempt=1, payload=[1]):
        assert alarms == [4]  # ceil(1.5 + 2): whole seconds, never sooner than the grace
    assert alarms == [4, 0]  # disarmed once the batch ends
    with pytest.raises(ConfigError, match="SLUICE_HARD_STOP_GRACE_S"):
        Settings.from_env({"SLUICE_HARD_STOP_GRACE_S": "0"})
