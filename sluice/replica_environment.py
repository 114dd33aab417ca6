"""A replica's environment, built on a thread while the launcher goes on with its other work.

A realtime API whose project installs packages runs its gunicorn with its environment's
interpreter (`predictors_runtime/environments`). Building that environment can take minutes on a
cold host, and the launcher must keep announcing its replicas and draining old generations
meanwhile, so the build runs on a thread and the launcher looks at it each step: until it is done
the new generation is announced as building (not routed: its old generation, if any, keeps
serving); a failed build is announced with the installer's message and tried again after a pause.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from foundation.errors import EnvironmentBuildFailed
from predictors_runtime.config import ApiConfig
from predictors_runtime.environments import Environment, EnvironmentSpec, HostEnvironments

# A failed build is tried again this long after it failed (an index that was down, a host fixed by hand).
RETRY_AFTER_S = 60.0


class BackgroundBuild:
    """One build of one environment on a thread; `stage`, then `environment` or `error`."""

    def __init__(self, environments: HostEnvironments, environment: dict[str, Any], project_dir: Path,
                 api: ApiConfig) -> None:
        self._environments = environments
        self._spec = EnvironmentSpec.from_dict(environment)
        self._project_dir = project_dir
        self._api = api
        self.stage = "waiting for its turn to build"
        self.environment: Environment | None = None
        self.error = ""
        self.finished_at = 0.0
        self._held: int | None = None
        self._released = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"environment-{self._spec.key}", daemon=True)
        built = environments.get(self._spec.key)
        if built is not None:  # on this host already: no thread, no wait for the launcher's next turn
            self.environment, self._held = built, environments.hold(self._spec.key)
            self.finished_at = time.time()
        else:
            self._thread.start()

    @property
    def key(self) -> str:
        return self._spec.key

    def done(self) -> bool:
        return self.environment is not None or (self._thread.ident is not None and not self._thread.is_alive())

    def _say(self, stage: str) -> None:
        self.stage = stage

    def _run(self) -> None:
        try:
            self.environment = self._environments.ensure_for(self._spec, self._project_dir, self._api,
                                                             progress=self._say)
            with self._lock:
                if not self._released:
                    self._held = self._environments.hold(self._spec.key)
        except EnvironmentBuildFailed as e:
            self.error = e.message
        except Exception as e:  # noqa: BLE001 - the launcher's loop must go on; the message says what broke
            self.error = f"{type(e).__name__}: {e}"
        self.finished_at = time.time()

    def again(self) -> BackgroundBuild:
        """A new try of the same build (after a failure)."""
        return BackgroundBuild(self._environments, self._spec.to_dict(), self._project_dir, self._api)

    def release(self) -> None:
        """The generation that used the environment is over: pruning may remove it (when nothing else uses it)."""
        with self._lock:
            self._released = True
            if self._held is not None:
                os.close(self._held)
                self._held = None
