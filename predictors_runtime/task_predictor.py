"""One instance of a user's `Task` (a TaskAPI's class), built for one task job and called once.

Cortex's TaskAPI runs `Task()(config)` once per job, `config` being the API's `definition.config`
merged with the job's. On a worker node a task job is a job of one batch (`jobs/batch/taskapi_jobs.py`),
so the task is built and called through the same path as a batch predictor: built in its API
version's namespace (`.env`, `definition.env`, `python_path`, the project folder as working
directory), called inside it, closed when the job ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from foundation.errors import PredictorError

from .builder import BuiltPredictor, build_predictor
from .config import ApiConfig, merge_config
from .loader import DeclaredCall


class TaskPredictor:
    """Wraps the user's `Task` so the batch path can run it as the job's only batch."""

    def __init__(self, built: BuiltPredictor, config: dict[str, Any]) -> None:
        self.built = built
        self.config = config
        if not callable(built.instance):
            raise PredictorError(f"{type(built.instance).__name__} has no __call__(self, config) method")
        self._call = DeclaredCall(built.instance.__call__, ("config",))

    @classmethod
    def build(
        cls, project_dir: Path, api: ApiConfig, job_spec: dict[str, Any], job_config: dict[str, Any],
        model_cache_dir: Path | None = None,
    ) -> TaskPredictor:
        """Construct the job's `Task`; its `config` is the API's merged with the job's (the job's keys win).

        `__init__` is offered `config` and `job_spec` and gets what it declares (Cortex's took none).
        Raises `PredictorError` carrying the user's traceback when the import or `__init__` fails.
        """
        config = merge_config(api.predictor.config, job_config)
        built = build_predictor(
            project_dir, api, {"config": config, "job_spec": job_spec},
            model_cache_dir=model_cache_dir or project_dir / ".sluice-models", poll_interval_s=0.0,
        )
        try:
            return cls(built, config)
        except BaseException:
            built.close()
            raise

    @property
    def instance(self) -> Any:
        """The user's `Task` object."""
        return self.built.instance

    def predict(self, payload: Any, batch_id: str) -> Any:
        """Run the task (the job's one batch carries nothing); its exceptions propagate to be recorded."""
        with self.built.namespace.active():
            self._call({"config": self.config})
        return None

    def on_job_complete(self, job_status: dict[str, Any] | None = None) -> None:
        """A task has no completion hook."""

    def close(self) -> None:
        """Drop the task's modules; the job is over for this process."""
        self.built.close()
