"""The model manager of one API: choosing versions, caching in memory and on disk, live reloading."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import (
    BadRequest,
    ConfigError,
    ModelNotFound,
    PredictorError,
)
from predictors_runtime.config import ModelsConfig
from predictors_runtime.models import DEFAULT_MODEL_NAME, LoadedModel, ModelManager


class Loader:
    """A `load(path)` returning the text of `model.txt`, counting its calls per model folder."""

    def __init__(self) -> None:
        self.calls: list[Path] = []
        self.error: Exception | None = None
        self.lock = threading.Lock()

    def __call__(self, path: Path) -> Any:
        with self.lock:
            self.calls.append(path)
        if self.error is not None:
            raise self.error
        return {"text": (path / "model.txt").read_text()}

    def count(self, name: str) -> int:
        return sum(1 for path in self.calls if path.parent.name == name)


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def manager_for(models: ModelsConfig, cache_dir: Path, loader: Loader) -> ModelManager:
    return ModelManager(models, "python", cache_dir, loader, poll_interval_s=0.05)


@pytest.fixture
def loader() -> Loader:
    return Loader()


@pytest.fixture
def versioned(tmp_path: Path, loader: Loader) -> tuple[ModelManager, Path]:
    """A `models.path` with versions 1 and 2, and its manager."""
    root = tmp_path / "store" / "iris"
    write(root, "1/model.txt", "one")
    write(root, "2/model.txt", "two")
    return manager_for(ModelsConfig(path=str(root)), tmp_path / "cache", loader), root


@pytest.fixture
def three_models(tmp_path: Path) -> Path:
    root = tmp_path / "store" / "models"
    for name in ("a", "b", "c"):
        write(root, f"{name}/model.txt", name * 3)
    return root


# --- choosing a version ----------------------------------------------------------------------------

def test_latest_is_the_highest_version_and_a_number_picks_one(versioned: tuple[ModelManager, Path],
                                                              loader: Loader, tmp_path: Path) -> None:
    manager, _ = versioned
    latest = manager.get()
    assert isinstance(latest, LoadedModel)
    assert (latest.name, latest.version, latest.model) == (DEFAULT_MODEL_NAME, 2, {"text": "two"})
    assert latest.path.parent == tmp_path / "cache" / DEFAULT_MODEL_NAME
    assert latest.path.name.startswith("2-") and (latest.path / "model.txt").read_text() == "two"
    assert manager.get(None, "1").model == {"text": "one"}
    assert manager.get(model_version=1).model == {"text": "one"}
    assert manager.names() == [DEFAULT_MODEL_NAME]
    assert manager.versions() == [1, 2]
    assert len(loader.calls) == 2  # each version loaded once, then served from memory
    assert manager.get() is latest


def test_nothing_touches_storage_before_first_use(tmp_path: Path, loader: Loader) -> None:
    manager = manager_for(ModelsConfig(path=str(tmp_path / "missing")), tmp_path / "cache", loader)
    assert not (tmp_path / "cache").exists()
    with pytest.raises(ConfigError, match="missing or empty"):
        manager.get()


def test_unknown_versions_are_refused_naming_the_versions_there(versioned: tuple[ModelManager, Path]) -> None:
    manager, _ = versioned
    with pytest.raises(ModelNotFound, match=r"^model has no version 3 \(versions: 1, 2\)$"):
        manager.get(model_version="3")
    with pytest.raises(BadRequest, match=r"""^model_version must be "latest" or an integer \(got 'newest'\); """
                                         r"model has versions 1, 2$"):
        manager.get(model_version="newest")
    with pytest.raises(ModelNotFound, match="serves a single model"):
        manager.get("iris")


def test_with_several_models_a_name_is_required_and_unknown_names_list_the_models(
        three_models: Path, tmp_path: Path, loader: Loader) -> None:
    manager = manager_for(ModelsConfig(dir=str(three_models)), tmp_path / "cache", loader)
    with pytest.raises(ModelNotFound, match=r"serves 3 models, so a model name is required \(one of: a, b, c\)"):
        manager.get()
    with pytest.raises(ModelNotFound, match=r"^no model named 'd' \(models: a, b, c\)$"):
        manager.get("d")
    with pytest.raises(ModelNotFound, match=r"^model c has no version 2 \(versions: 1\)$"):
        manager.get("c", 2)
    assert manager.get("b").model == {"text": "bbb"}


def test_a_load_that_raises_is_a_predictor_error(versioned: tuple[ModelManager, Path], loader: Loader) -> None:
    manager, _ = versioned
    loader.error = ValueError("corrupt weights")
    with pytest.raises(PredictorError, match="model version 2 .* failed to load: ValueError: corrupt weights"):
        manager.get()
    loader.error = None
    assert manager.get().model == {"text": "two"}


# --- caches --------------------------------------------------------------------------------------

def test_memory_holds_cache_size_models_and_evicts_the_least_recently_used(
        three_models: Path, tmp_path: Path, loader: Loader) -> None:
    manager = manager_for(ModelsConfig(dir=str(three_models), cache_size=2), tmp_path / "cache", loader)
    manager.get("a")
    manager.get("b")
    manager.get("a")
    manager.get("c")  # "b" is the least recently used
    assert manager.loaded() == [("a", 1), ("c", 1)]
    assert (loader.count("a"), loader.count("b"), loader.count("c")) == (1, 1, 1)
    manager.get("b")
    assert loader.count("b") == 2
    assert manager.loaded() == [("c", 1), ("b", 1)]


def test_the_disk_holds_disk_cache_size_folders_and_deletes_the_evicted(
        three_models: Path, tmp_path: Path, loader: Loader) -> None:
    models = ModelsConfig(dir=str(three_models), cache_size=1, disk_cache_size=2)
    manager = manager_for(models, tmp_path / "cache", loader)
    a, b = manager.get("a"), manager.get("b")
    assert a.path.is_dir() and b.path.is_dir()
    c = manager.get("c")
    assert not a.path.exists()
    assert b.path.is_dir() and c.path.is_dir()
    assert manager.get("b").path == b.path  # still on disk: loaded again without a download
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["a", "b", "c"]


def test_model_names_that_are_not_safe_folder_names_stay_inside_the_cache(tmp_path: Path, loader: Loader) -> None:
    write(tmp_path / "store", "m/model.txt", "escaped?")
    models = ModelsConfig(paths=[{"name": "../../outside", "path": str(tmp_path / "store" / "m")}])
    loaded = manager_for(models, tmp_path / "cache", loader).get()
    assert loaded.model == {"text": "escaped?"}
    assert loaded.path.parent.parent == tmp_path / "cache"
    assert loaded.path.parent.name.startswith("_.._outside-")


def test_concurrent_requests_for_one_version_load_it_once(versioned: tuple[ModelManager, Path],
                                                           loader: Loader) -> None:
    manager, _ = versioned
    results: list[LoadedModel] = []
    barrier = threading.Barrier(8)

    def request() -> None:
        barrier.wait()
        results.append(manager.get())

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 8 and len({id(r) for r in results}) == 1
    assert len(loader.calls) == 1


# --- live reloading ----------------------------------------------------------------------------------

def test_a_new_version_becomes_latest_and_is_loaded_by_the_poll(versioned: tuple[ModelManager, Path],
                                                                loader: Loader) -> None:
    manager, root = versioned
    manager.get()
    write(root, "3/model.txt", "three")
    assert manager.poll_once(100.0) == ["model: version 3 added", "model: version 3 loaded"]
    assert manager.last_poll == 100.0
    calls = len(loader.calls)
    assert manager.get().model == {"text": "three"}
    assert len(loader.calls) == calls
    assert manager.poll_once(101.0) == []


def test_a_removed_version_disappears_from_memory_and_disk(versioned: tuple[ModelManager, Path]) -> None:
    manager, root = versioned
    two = manager.get()
    manager.get(model_version=1)
    shutil.rmtree(root / "2")
    assert manager.poll_once(1.0) == ["model: version 2 removed"]
    assert manager.versions() == [1]
    assert manager.loaded() == [(DEFAULT_MODEL_NAME, 1)]
    assert not two.path.exists()
    with pytest.raises(ModelNotFound, match=r"no version 2 \(versions: 1\)"):
        manager.get(model_version=2)
    assert manager.get().model == {"text": "one"}


def test_a_file_changed_in_place_reloads_while_requests_in_flight_keep_the_old_model(
        versioned: tuple[ModelManager, Path], loader: Loader) -> None:
    manager, root = versioned
    in_flight = manager.get()
    write(root, "2/model.txt", "two, retrained")
    assert manager.poll_once(1.0) == ["model: version 2 changed", "model: version 2 loaded"]
    fresh = manager.get()
    assert fresh.model == {"text": "two, retrained"}
    assert fresh.path != in_flight.path and not in_flight.path.exists()
    assert in_flight.model == {"text": "two"}
    assert len(loader.calls) == 2


def test_a_change_to_a_version_not_in_memory_is_loaded_on_next_use(versioned: tuple[ModelManager, Path],
                                                                   loader: Loader) -> None:
    manager, root = versioned
    manager.get()
    write(root, "1/model.txt", "one, retrained")
    assert manager.poll_once(1.0) == ["model: version 1 changed"]
    assert len(loader.calls) == 1
    assert manager.get(model_version=1).model == {"text": "one, retrained"}


def test_a_reload_that_fails_keeps_serving_the_previous_model(versioned: tuple[ModelManager, Path],
                                                              loader: Loader,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    manager, root = versioned
    before = manager.get()
    write(root, "2/model.txt", "two, broken")
    loader.error = ValueError("bad magic number")
    lines = manager.poll_once(1.0)
    assert lines[0] == "model: version 2 changed"
    assert lines[1].startswith("model: version 2 failed to load: ")
    assert lines[1].endswith("ValueError: bad magic number")
    assert "failed to load; keeping the previous state" in caplog.text
    assert manager.get() is before
    assert before.path.is_dir()
    loader.error = None  # fixed: the next poll tries again
    assert manager.poll_once(2.0) == ["model: version 2 changed", "model: version 2 loaded"]
    assert manager.get().model == {"text": "two, broken"}


def test_a_new_version_that_fails_to_load_does_not_become_latest(versioned: tuple[ModelManager, Path],
                                                                 loader: Loader) -> None:
    manager, root = versioned
    manager.get()
    write(root, "3/model.txt", "three")
    loader.error = RuntimeError("out of memory")
    lines = manager.poll_once(1.0)
    assert lines[0] == "model: version 3 added" and "version 3 failed to load" in lines[1]
    assert manager.versions() == [1, 2]
    assert manager.get().model == {"text": "two"}


def test_removing_the_latest_loads_the_previous_one(versioned: tuple[ModelManager, Path]) -> None:
    manager, root = versioned
    manager.get()
    shutil.rmtree(root / "2")
    assert manager.poll_once(1.0) == ["model: version 2 removed", "model: version 1 loaded"]
    assert manager.loaded() == [(DEFAULT_MODEL_NAME, 1)]


def test_a_half_uploaded_version_is_ignored_until_it_is_complete(tmp_path: Path, loader: Loader) -> None:
    root = tmp_path / "store" / "onnx"
    write(root, "1/model.onnx", "one")
    manager = ModelManager(ModelsConfig(path=str(root)), "onnx", tmp_path / "cache",
                           lambda p: sorted(x.name for x in p.iterdir()))
    assert manager.get().model == ["model.onnx"]
    write(root, "2/weights.bin", "...")
    lines = manager.poll_once(1.0)
    assert lines == [(f"ignored, keeping the previous state: {root / '2'}: an ONNX model needs exactly one "
                      "*.onnx file, found 0")]
    assert manager.versions() == [1]
    write(root, "2/model.onnx", "two")
    assert manager.poll_once(2.0) == ["model: version 2 added", "model: version 2 loaded"]


def test_models_added_to_and_removed_from_dir_come_and_go(three_models: Path, tmp_path: Path,
                                                          loader: Loader) -> None:
    manager = manager_for(ModelsConfig(dir=str(three_models)), tmp_path / "cache", loader)
    a = manager.get("a")
    write(three_models, "d/5/model.txt", "ddd")
    shutil.rmtree(three_models / "a")
    assert manager.poll_once(1.0) == ["model d: version 5 added", "model a: version 1 removed"]
    assert manager.names() == ["b", "c", "d"]
    assert manager.get("d").model == {"text": "ddd"}
    assert not a.path.exists()
    with pytest.raises(ModelNotFound, match="no model named 'a'"):
        manager.get("a")


def test_an_emptied_path_keeps_its_model(versioned: tuple[ModelManager, Path]) -> None:
    manager, root = versioned
    manager.get()
    shutil.rmtree(root)
    lines = manager.poll_once(1.0)
    assert lines == [f"ignored, keeping the previous state: {root}: the folder of model _default is missing or empty"]
    assert manager.get().model == {"text": "two"}


def test_the_first_poll_only_discovers(versioned: tuple[ModelManager, Path], loader: Loader) -> None:
    manager, _ = versioned
    assert manager.poll_once(5.0) == []
    assert manager.versions() == [1, 2] and loader.calls == []


def test_a_poll_that_cannot_list_reports_it_and_keeps_everything(tmp_path: Path, three_models: Path,
                                                                 loader: Loader) -> None:
    manager = manager_for(ModelsConfig(dir=str(three_models)), tmp_path / "cache", loader)
    manager.get("a")
    shutil.rmtree(three_models)
    assert manager.poll_once(1.0) == [f"listing the models failed: {three_models}: the models dir is missing or empty"]
    assert manager.names() == ["a", "b", "c"]


# --- the polling thread -------------------------------------------------------------------------------

class Polls:
    """Counts the polls of a manager's thread, and wakes a test waiting on one."""

    def __init__(self, manager: ModelManager) -> None:
        self.seen = threading.Condition()
        self.count = 0
        self._poll_once = manager.poll_once
        manager.poll_once = self  # type: ignore[method-assign]  # the thread calls self.poll_once(now)

    def __call__(self, now: float) -> list[str]:
        lines = self._poll_once(now)
        with self.seen:
            self.count += 1
            self.seen.notify_all()
        return lines

    def wait_until(self, condition: Any, timeout: float = 10.0) -> bool:
        """Whether `condition()` held after some poll within `timeout` s."""
        with self.seen:
            return self.seen.wait_for(condition, timeout)


def test_polling_runs_in_a_thread_until_stopped(versioned: tuple[ModelManager, Path]) -> None:
    manager, root = versioned
    polls = Polls(manager)
    manager.get()
    manager.start_polling()
    thread = manager._thread
    manager.start_polling()
    assert manager._thread is thread and thread is not None and thread.daemon
    write(root, "3/model.txt", "three")
    assert polls.wait_until(lambda: manager.versions() == [1, 2, 3]), "version 3 was not picked up"
    manager.stop_polling()
    assert not thread.is_alive()
    polled, count = manager.last_poll, polls.count
    write(root, "4/model.txt", "four")
    # Four poll intervals without a poll.
    assert not polls.wait_until(lambda: polls.count > count, timeout=4 * manager.poll_interval_s)
    assert manager.last_poll == polled and manager.versions() == [1, 2, 3]


# A forked child starting its own poller: tests/integration/test_models_polling_fork.py.
