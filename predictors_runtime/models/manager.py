"""The models of one API in one process: download, load, cache in memory and on disk, live-reload.

Memory holds `cache_size` loaded models (None: all) and the disk `disk_cache_size` downloaded
folders (None: all), each least recently used first out. A version is downloaded to
`cache_dir/<name>/<version>-<fingerprint hash>/` through a temporary folder renamed into place,
so a folder of that name is always complete and can be reused by any process sharing the cache.

Nothing in this module mutates a `LoadedModel`: a request in flight keeps the model it started
with by holding its `LoadedModel`, and a reload replaces the cache entry, dropping the manager's
only reference to the old model so that its memory is freed once those requests finish.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation import figure_sink as figures
from foundation.errors import (
    BadRequest,
    ModelNotFound,
    PredictorError,
    SluiceError,
)
from predictors_runtime.config import ModelsConfig

from . import disk
from .cache import LRU
from .layout import (
    DEFAULT_MODEL_NAME,
    LayoutProblem,
    ModelVersion,
    Versions,
    discover,
    scan,
)
from .reloading import compare, label

log = logging.getLogger(__name__)

_MANAGERS: weakref.WeakSet[ModelManager] = weakref.WeakSet()
_FORK_HOOK_LOCK = threading.Lock()
_fork_hook_registered = False


@dataclass(frozen=True)
class LoadedModel:
    """One loaded version: never changed after creation, so holders keep a consistent model."""

    name: str
    version: int
    path: Path  # the local folder it was loaded from
    model: Any  # what `load(path)` returned


@dataclass(frozen=True)
class _Entry:
    source: ModelVersion
    loaded: LoadedModel


def _after_fork_in_child() -> None:
    for manager in list(_MANAGERS):
        manager._reset_after_fork()


class ModelManager:
    """Downloads, loads, caches and live-reloads the models of one API in one process."""

    def __init__(self, models: ModelsConfig, predictor_type: str, cache_dir: Path, load: Callable[[Path], Any],
                 poll_interval_s: float = 10.0, api_name: str = "") -> None:
        self._models = models
        self.api_name = api_name  # labels the loads counted in the process's figures
        self._type = predictor_type
        self._cache_dir = Path(cache_dir)
        self._load = load
        self.poll_interval_s = poll_interval_s
        self.last_poll: float | None = None  # the `now` of the latest `poll_once`
        self._versions: Versions | None = None  # replaced whole, never edited in place
        self._memory: LRU[tuple[str, int], _Entry] = LRU(models.cache_size)
        self._disk: LRU[tuple[str, int, str], Path] = LRU(models.disk_cache_size)
        self._want_polling = False
        self._reset_after_fork()
        global _fork_hook_registered
        with _FORK_HOOK_LOCK:
            if not _fork_hook_registered:
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook_registered = True
            _MANAGERS.add(self)

    def _reset_after_fork(self) -> None:
        """Fresh locks and no threads: a forked child inherits neither a running poller nor loads in flight."""
        self._lock = threading.Lock()  # guards _versions, _memory, _disk, _inflight, _thread
        self._discover_lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._inflight: dict[tuple[str, int, str], Future[LoadedModel]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # --- reading ---------------------------------------------------------------------------------

    def _state(self) -> Versions:
        """The served models, discovered on first use (a bad layout raises `ConfigError`)."""
        state = self._versions
        if state is None:
            with self._discover_lock:
                if self._versions is None:
                    found = discover(self._models, self._type)
                    with self._lock:
                        self._versions = found
                state = self._versions
            assert state is not None
        return state

    def names(self) -> list[str]:
        """Model names, sorted (`DEFAULT_MODEL_NAME` alone for `models.path`)."""
        return sorted(self._state())

    def versions(self, model_name: str | None = None) -> list[int]:
        """The versions of a model, ascending; an unversioned model has version 1."""
        state = self._state()
        return sorted(state[self._resolve_name(state, model_name)])

    def loaded(self) -> list[tuple[str, int]]:
        """`(name, version)` of the models held in memory, least recently used first."""
        with self._lock:
            return self._memory.keys()

    @staticmethod
    def _resolve_name(state: Versions, model_name: str | None) -> str:
        names = sorted(state)
        if model_name is None:
            if len(names) == 1:
                return names[0]
            raise ModelNotFound(f"this API serves {len(names)} models, so a model name is required "
                                f"(one of: {', '.join(names)})")
        if model_name not in state:
            if names == [DEFAULT_MODEL_NAME]:
                raise ModelNotFound(f"no model named {model_name!r}: this API serves a single model "
                                    "(models.path); leave the model name out")
            raise ModelNotFound(f"no model named {model_name!r} (models: {', '.join(names) or 'none'})")
        return model_name

    def _resolve(self, model_name: str | None, model_version: str | int) -> ModelVersion:
        state = self._state()
        name = self._resolve_name(state, model_name)
        versions = state[name]
        listed = ", ".join(str(v) for v in sorted(versions)) or "none"
        number: int | None = None
        if model_version == "latest" or model_version is None:
            if not versions:
                raise ModelNotFound(f"{label(name)} has no versions")
            number = max(versions)
        elif isinstance(model_version, int) and not isinstance(model_version, bool):
            number = model_version
        elif isinstance(model_version, str) and model_version.strip().isdigit():
            number = int(model_version.strip())
        if number is None:
            raise BadRequest(f'model_version must be "latest" or an integer (got {model_version!r}); '
                             f"{label(name)} has versions {listed}")
        if number not in versions:
            raise ModelNotFound(f"{label(name)} has no version {number} (versions: {listed})")
        return versions[number]

    def get(self, model_name: str | None = None, model_version: str | int = "latest") -> LoadedModel:
        """The loaded model, from memory or downloaded and loaded now."""
        if self._want_polling and self._thread is None:
            self.start_polling()  # in a forked child: the parent's poller did not come along
        wanted = self._resolve(model_name, model_version)
        key = (wanted.name, wanted.version)
        with self._lock:
            entry = self._memory.get(key)
            if entry is not None and entry.source.files == wanted.files:
                self._disk.get((wanted.name, wanted.version, disk.digest(wanted)))
                return entry.loaded
        loaded = self._materialize(wanted)
        with self._lock:
            current = (self._versions or {}).get(wanted.name, {}).get(wanted.version)
            entry = self._memory.peek(key)
            if current is not None and current.files == wanted.files:
                if entry is not None and entry.source.files == wanted.files:
                    loaded = entry.loaded  # another thread cached the same files meanwhile
                else:
                    self._memory.put(key, _Entry(wanted, loaded))
        return loaded

    # --- downloading and loading ------------------------------------------------------------------

    def _materialize(self, version: ModelVersion) -> LoadedModel:
        """Download (or reuse) and load `version`; concurrent calls for the same files share one load."""
        key = (version.name, version.version, disk.digest(version))
        with self._lock:
            future = self._inflight.get(key)
            owner = future is None
            if future is None:
                future = self._inflight[key] = Future()
        if not owner:
            return future.result()
        try:
            loaded = self._download_and_load(version, key)
        except BaseException as e:
            future.set_exception(e)
            raise
        else:
            future.set_result(loaded)
            return loaded
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            del future  # the waiters hold their own reference; the manager keeps none

    def _download_and_load(self, version: ModelVersion, key: tuple[str, int, str]) -> LoadedModel:
        started = time.perf_counter()
        folder = disk.version_folder(self._cache_dir, version)
        if not folder.is_dir():
            disk.download(version, folder)
        try:
            model = self._load(folder)
        except BaseException as e:
            disk.remove([folder])  # keep no folder the disk cache does not track
            if isinstance(e, SluiceError) or not isinstance(e, Exception):
                raise
            raise PredictorError(f"{label(version.name)} version {version.version} ({version.uri}) "
                                 f"failed to load: {type(e).__name__}: {e}") from e
        # Counted once loaded: the download (when not on disk already) and the load, what a request waits for.
        figures.count("sluice_model_loads_total", (self.api_name, version.name))
        figures.observe("sluice_model_load_seconds", (self.api_name,), time.perf_counter() - started)
        # Tracked only once loaded, so a folder being loaded is never evicted under the loader.
        with self._lock:
            evicted = self._disk.put(key, folder)
        disk.remove(path for _, path in evicted if path != folder)
        return LoadedModel(version.name, version.version, folder, model)

    # --- live reloading ----------------------------------------------------------------------------

    def poll_once(self, now: float) -> list[str]:
        """One step of live reloading; returns (and logs) one line per change seen or made."""
        with self._poll_lock:
            self.last_poll = now
            if self._versions is None:
                try:
                    self._state()
                except Exception as e:
                    log.exception("live reloading: cannot discover the models")
                    return [f"discovering the models failed: {e}"]
                return []
            problems: list[LayoutProblem] = []
            try:
                fresh = scan(self._models, self._type, problems)
            except Exception as e:
                log.exception("live reloading: cannot list the models")
                return [f"listing the models failed: {e}"]
            return self._apply(fresh, problems)

    def _apply(self, fresh: Versions, problems: list[LayoutProblem]) -> list[str]:
        old = self._versions or {}
        diff = compare(old, fresh, problems, models_can_vanish=self._models.dir is not None)
        state = diff.state
        with self._lock:
            in_memory = set(self._memory.keys())
        # Reload what is served from memory now: changed versions, and a model's new latest.
        wanted = {(m.name, m.version): m for m in diff.changed if (m.name, m.version) in in_memory}
        for name, versions in state.items():
            before = old.get(name, {})
            if versions and before and max(versions) != max(before) and (name, max(before)) in in_memory:
                latest = versions[max(versions)]
                if (name, latest.version) not in in_memory:  # if it is, and changed, it is wanted already
                    wanted[(name, latest.version)] = latest
        lines = diff.describe()
        ready: dict[tuple[str, int], _Entry] = {}
        for key, version in sorted(wanted.items()):
            try:
                ready[key] = _Entry(version, self._materialize(version))
                lines.append(f"{label(key[0])}: version {key[1]} loaded")
            except Exception as e:
                log.exception("live reloading: %s version %s failed to load; keeping the previous state",
                              label(key[0]), key[1])
                lines.append(f"{label(key[0])}: version {key[1]} failed to load: {e}")
                previous = old.get(key[0], {}).get(key[1])
                if previous is not None:  # changed: keep serving the old files, try again next poll
                    state[key[0]][key[1]] = previous
                else:  # added: not served until it loads, so "latest" stays what it was
                    del state[key[0]][key[1]]
        stale: list[Path] = []
        with self._lock:
            for version in diff.removed:
                self._memory.pop((version.name, version.version))
            for key, entry in ready.items():
                self._memory.put(key, entry)
            for disk_key in self._disk.keys():  # noqa: SIM118 (a copy: entries are popped)
                current = state.get(disk_key[0], {}).get(disk_key[1])
                if current is None or disk.digest(current) != disk_key[2]:
                    stale.append(self._disk.pop(disk_key) or Path())
            self._versions = state
        disk.remove(p for p in stale if p != Path())
        for line in lines:
            log.info("live reloading: %s", line)
        return lines

    def start_polling(self) -> None:
        """Poll every `poll_interval_s` in a daemon thread; idempotent, and restarted lazily after a fork."""
        with self._lock:
            self._want_polling = True
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            thread = threading.Thread(target=self._poll_loop, args=(self._stop,), daemon=True,
                                      name=f"sluice-model-poll-{os.getpid()}")
            self._thread = thread
        thread.start()

    def stop_polling(self) -> None:
        """Stop the polling thread (and the lazy start in forked children); waits for it to finish."""
        with self._lock:
            self._want_polling = False
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(self.poll_interval_s, 1.0) + 60)

    def _poll_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_interval_s):
            try:
                self.poll_once(time.time())
            except Exception:  # poll_once reports its own failures; this is a last resort
                log.exception("live reloading: poll failed")
