"""A small Python client of Sluice's HTTP API (`sluice.client()`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import requests

from predictors_runtime.errors import SluiceError
from predictors_runtime.project import pack_project

DEFAULT_URL = "http://127.0.0.1:8888"
TERMINAL_STATUSES = {
    "status_enqueue_failed", "status_completed_with_failures", "status_succeeded", "status_unexpected_error",
    "status_worker_error", "status_worker_oom", "status_timed_out", "status_stopped",
}


class ClientError(SluiceError):
    """The server answered with an error; `status` and `kind` are what it said."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(f"{status} {kind}: {message}")
        self.http_status = status
        self.kind = kind
        self.server_message = message


class Client:
    def __init__(self, url: str | None = None, timeout: float = 60.0) -> None:
        self.url = (url or os.environ.get("SLUICE_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        self._session = requests.Session()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._session.request(method, f"{self.url}{path}", timeout=self.timeout, **kwargs)
        except requests.ConnectionError as e:
            raise ClientError(0, "unreachable", f"cannot reach Sluice at {self.url} (is `sluice up` running?)") from e
        try:
            body = response.json()
        except ValueError:
            body = {"kind": "bad_response", "message": response.text[:500]}
        if not response.ok:
            raise ClientError(response.status_code, body.get("kind", "error"), body.get("message", ""))
        return body

    # -- APIs -------------------------------------------------------------------------------
    def deploy(self, config_path: str | Path = "cortex.yaml") -> list[dict[str, Any]]:
        """Pack the project folder of `config_path` and deploy every API it lists."""
        config_path = Path(config_path)
        if config_path.is_dir():
            config_path = config_path / "cortex.yaml"
        project = pack_project(config_path.parent, config_path)
        files = {
            "config": (config_path.name, config_path.read_bytes(), "application/yaml"),
            "project": ("project.tar.gz", project, "application/gzip"),
        }
        return self._call("POST", "/apis", files=files)["apis"]

    def apis(self) -> list[dict[str, Any]]:
        return self._call("GET", "/apis")["apis"]

    def api(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/apis/{name}")

    def delete_api(self, name: str, force: bool = False) -> dict[str, Any]:
        return self._call("DELETE", f"/apis/{name}", params={"force": "true"} if force else None)

    # -- realtime ---------------------------------------------------------------------------
    def predict(
        self, api_name: str, payload: Any, params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """POST `payload` as JSON to a realtime API; its answer (parsed JSON, else text or bytes)."""
        try:
            response = self._session.post(
                f"{self.url}/{api_name}", data=json.dumps(payload), params=params, timeout=self.timeout,
                headers={"Content-Type": "application/json", **(headers or {})},
            )
        except requests.ConnectionError as e:
            raise ClientError(0, "unreachable", f"cannot reach Sluice at {self.url} (is `sluice up` running?)") from e
        content_type = response.headers.get("Content-Type", "")
        if not response.ok:
            try:
                body = response.json()
            except ValueError:
                body = {"kind": "error", "message": response.text[:500]}
            raise ClientError(response.status_code, body.get("kind", "error"), body.get("message", ""))
        if content_type.startswith("application/json"):
            return response.json()
        if content_type.startswith("text/"):
            return response.text
        return response.content

    def readiness(self, api_name: str) -> dict[str, Any]:
        """`GET /<api_name>`: the API's readiness and models; raises ClientError (503) until ready."""
        return self._call("GET", f"/{api_name}")

    def wait_ready(self, api_name: str, timeout: float = 120.0, poll: float = 0.2) -> dict[str, Any]:
        """Poll `GET /<api_name>` until a replica answers 200; returns that answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.readiness(api_name)
            except ClientError as e:
                if e.http_status not in (0, 502, 503, 504):  # not deployed, or not a realtime API
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(f"api {api_name} not ready after {timeout:.0f}s: {e}") from e
            time.sleep(poll)

    # -- jobs -------------------------------------------------------------------------------
    def submit_raw(self, api_name: str, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        params = {"dryRun": "true"} if dry_run else None
        return self._call("POST", f"/batch/{api_name}", data=json.dumps(body),
                          headers={"Content-Type": "application/json"}, params=params)

    def submit(
        self, api_name: str, items: list[Any], batch_size: int, workers: int = 1,
        config: dict[str, Any] | None = None, timeout: int | None = None, tries: int | None = None,
    ) -> dict[str, Any]:
        """Submit an item list; returns the job spec."""
        body: dict[str, Any] = {"workers": workers, "item_list": {"items": items, "batch_size": batch_size}}
        if config:
            body["config"] = config
        if timeout is not None:
            body["timeout"] = timeout
        if tries is not None:
            body["sqs_dead_letter_queue"] = {"arn": "", "max_receive_count": tries}
        return self.submit_raw(api_name, body)

    def job(self, api_name: str, job_id: str) -> dict[str, Any]:
        """The job's `job_status`."""
        return self._call("GET", f"/batch/{api_name}", params={"jobID": job_id})["job_status"]

    def jobs(self, api_name: str, limit: int = 100) -> list[dict[str, Any]]:
        return self._call("GET", f"/batch/{api_name}", params={"limit": limit})["jobs"]

    def stop(self, api_name: str, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/batch/{api_name}", params={"jobID": job_id})

    def failed_batches(self, api_name: str, job_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/batch/{api_name}/failed", params={"jobID": job_id})["failed_batches"]

    def wait(
        self, api_name: str, job_id: str, timeout: float = 600.0, poll: float = 0.25,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends; returns its final `job_status`."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.job(api_name, job_id)
            if on_progress is not None:
                on_progress(status)
            if status["status"] in TERMINAL_STATUSES:
                return status
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status['status']} after {timeout:.0f}s")
            time.sleep(poll)


def client(url: str | None = None) -> Client:
    """A client for the Sluice at `url`, else `SLUICE_URL`, else the local default."""
    return Client(url)
