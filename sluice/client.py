"""A small Python client of Sluice's HTTP API (`sluice.client()`).

Errors come back typed: the server's `{"kind", "message"}` body becomes the `ClientError`
subclass registered for that kind (`ApiNotFound`, `JobNotFound`, `Conflict`, ...), so callers
catch what they mean instead of parsing messages. A request the proxy refused for want of
capacity (503 with `Retry-After`) is tried again after a while (`RetryPolicy`) before its
`Overloaded` is raised.
"""

from __future__ import annotations

import json
import os
import random as _random
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import requests
import yaml

from foundation.api_kinds import ApiKind
from foundation.errors import SluiceError
from foundation.job_submissions import submission_body, task_submission_body
from jobs.batch.job import ACTIVE_STATUSES as _ACTIVE
from jobs.batch.job import TERMINAL_STATUSES as _TERMINAL
from predictors_runtime.project import pack_project

DEFAULT_URL = "http://127.0.0.1:8888"
TERMINAL_STATUSES = {status.value for status in _TERMINAL}
ACTIVE_STATUSES = {status.value for status in _ACTIVE}



def _records(answer: dict[str, Any], field: str) -> list[dict[str, Any]]:
    """`answer[field]`, a list of JSON objects as the API documents it."""
    found = answer.get(field)
    if not isinstance(found, list):
        raise ServerError(200, "bad_response", f"expected a list in {field!r}")
    return found

class ClientError(SluiceError):
    """The server answered with an error (or could not be reached: status 0).

    `http_status`, `kind` and `server_message` are what it said; the subclass is chosen by `kind`.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        text = f"{status} {kind}: {message}" if status else f"{kind}: {message}"
        super().__init__(text)
        self.http_status = status
        self.kind = kind
        self.server_message = message


class NotFound(ClientError):
    """404: the named thing does not exist."""


class ApiNotFound(NotFound):
    """404 api_not_found: no API of that name is deployed."""


class JobNotFound(NotFound):
    """404 job_not_found: no job of that id exists for that API."""


class ModelNotFound(NotFound):
    """404 model_not_found: the realtime API serves no such model or version."""


class BadRequest(ClientError):
    """400: the request (body, parameter, submission) is malformed or breaks a rule."""


class InvalidConfig(BadRequest):
    """400 invalid_config: the API configuration or project folder is invalid."""


class InvalidModelInput(BadRequest):
    """400 invalid_model_input: the payload does not fit the model's input signature."""


class Conflict(ClientError):
    """409: the thing is in the wrong state (a job already ended, an API with running jobs)."""


class PayloadTooLarge(ClientError):
    """413: the request body is larger than Sluice accepts."""


class NotReady(ClientError):
    """503 not_ready: the API (or a dependency) is not ready yet."""


class NotAcknowledged(ClientError):
    """503 not_acknowledged: Sluice's Redis took the write but no replica confirmed it in time; it
    may or may not have taken (a submission retried with its idempotency key gets its job either way)."""


class Overloaded(NotReady):
    """503 overloaded: the realtime API's queue is full; retry later."""


class RequestTimeout(ClientError):
    """504 request_timeout: the realtime API did not answer by its deadline."""


class PredictorError(ClientError):
    """500 predictor_error: the predictor raised."""


class ServerError(ClientError):
    """5xx of any other kind."""


class Unreachable(ClientError):
    """Sluice could not be reached at all (status 0)."""


class UntrustedCertificate(Unreachable):
    """Sluice's address serves TLS with a certificate this client does not trust (status 0)."""


class Unsupported(ClientError):
    """A Cortex client argument Sluice has no equivalent for (refused here, never sent)."""


ERRORS_BY_KIND: dict[str, type[ClientError]] = {
    "not_found": NotFound, "api_not_found": ApiNotFound, "job_not_found": JobNotFound,
    "model_not_found": ModelNotFound, "storage_not_found": NotFound,
    "bad_request": BadRequest, "invalid_config": InvalidConfig, "invalid_model_input": InvalidModelInput,
    "bad_storage_uri": BadRequest, "conflict": Conflict, "payload_too_large": PayloadTooLarge,
    "not_ready": NotReady, "overloaded": Overloaded, "request_timeout": RequestTimeout,
    "predictor_error": PredictorError, "unreachable": Unreachable, "unsupported": Unsupported,
    "untrusted_certificate": UntrustedCertificate, "not_acknowledged": NotAcknowledged,
}
_ERRORS_BY_STATUS: dict[int, type[ClientError]] = {
    400: BadRequest, 404: NotFound, 409: Conflict, 413: PayloadTooLarge, 503: NotReady, 504: RequestTimeout,
}


def error_for(status: int, kind: str, message: str) -> ClientError:
    """The typed error for a server answer: by its kind, else by its status."""
    cls = ERRORS_BY_KIND.get(kind) or _ERRORS_BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else ClientError
    return cls(status, kind, message)


def default_url(env: dict[str, str] | os._Environ[str] | None = None) -> str:
    """Where the Sluice is: SLUICE_URL, else SLUICE_API_URL (set for predictors), else the local default.

    Inside a predictor this is the Sluice that runs it: replicas get SLUICE_API_URL from their
    launcher and batch workers get SLUICE_URL from the stack that started them.
    """
    env = os.environ if env is None else env
    return (env.get("SLUICE_URL") or env.get("SLUICE_API_URL") or DEFAULT_URL).rstrip("/")


def _error_of(response: requests.Response) -> ClientError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"kind": "error", "message": response.text[:500]}
    return error_for(response.status_code, str(body.get("kind", "error")), str(body.get("message", "")))


@dataclass(frozen=True)
class RetryPolicy:
    """How a request refused with 503 and `Retry-After` is sent again.

    Such a refusal (the proxy's `overloaded`: every slot taken and the queue full) comes before
    the request ran, so sending it again is safe even for a POST; so does the management API's
    `not_acknowledged` to a submission with an `Idempotency-Key` (its retry carries the same key, so
    it gets the job the first try made, if any). Any other error, and a 503 without `Retry-After`,
    is raised at once. Each wait is at least the server's `Retry-After`
    and at least `backoff` doubled per retry, stretched at random by up to `jitter` of itself so
    that clients refused together do not return together, and cut to `max_wait`. A call gives up
    (raising the last refusal's `Overloaded`) after `retries` retries, or sooner when the next
    wait would end more than `max_total` seconds after the call began. `sleep`, `clock` and
    `random` are there for tests.
    """

    retries: int = 3
    max_wait: float = 10.0
    max_total: float = 30.0
    backoff: float = 0.5
    jitter: float = 0.5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    random: Callable[[], float] = field(default=_random.random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.retries < 0 or self.max_wait < 0 or self.max_total < 0 or self.backoff < 0 or self.jitter < 0:
            raise ValueError(f"a RetryPolicy's numbers cannot be negative: {self!r}")

    def delay(self, retry: int, retry_after: float) -> float:
        """Seconds to wait before retry number `retry` (0 for the first) when told `retry_after`."""
        base = max(retry_after, self.backoff * 2 ** retry)
        return float(min(self.max_wait, base * (1 + self.jitter * self.random())))


def _retry_after_s(response: requests.Response) -> float | None:
    """The seconds a 503's `Retry-After` asks for (delta-seconds or an HTTP date), else None.

    None (no header, or one that is not a time) means the answer is not to be retried.
    """
    if response.status_code != 503:
        return None
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _tls_failure(url: str, error: requests.exceptions.SSLError) -> str:
    """Why a TLS connection to Sluice failed, and what to do about it."""
    cause = str(error)
    if "CERTIFICATE_VERIFY_FAILED" in cause or "certificate verify failed" in cause:
        reason = cause.split("certificate verify failed:", 1)[-1].split("(_ssl", 1)[0].strip(" )'\"") or "not trusted"
        return (f"Sluice at {url} presented a certificate this client does not trust ({reason}): give the CA that "
                f"signed it with --ca-bundle FILE or {CA_BUNDLE_VARIABLE}=FILE")
    if "WRONG_VERSION_NUMBER" in cause or "wrong version number" in cause:
        return f"{url} does not answer TLS: is it an http:// address?"
    return f"TLS with Sluice at {url} failed: {cause}"


def _with_requirements(root: Path, copy: Path, requirements: list[str]) -> Path:
    """A copy of the project folder whose requirements.txt also lists `requirements` (create_api's)."""
    shutil.copytree(root, copy, symlinks=True)
    existing = (copy / "requirements.txt").read_text() if (copy / "requirements.txt").is_file() else ""
    lines = [line for line in existing.splitlines() if line.strip()] + [str(r) for r in requirements]
    (copy / "requirements.txt").write_text("\n".join(lines) + "\n")
    return copy


CA_BUNDLE_VARIABLE = "SLUICE_CA_BUNDLE"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def new_idempotency_key() -> str:
    """A key for one submission: sent with it and with each of its retries, never with another."""
    return uuid.uuid4().hex


def trusted_cas(ca_bundle: str | Path | None = None,
                env: dict[str, str] | os._Environ[str] | None = None) -> str | bool:
    """What an https address's certificate is checked against: `ca_bundle`, else SLUICE_CA_BUNDLE,
    else the system's CAs (requests' `verify` value). A bundle that is not a readable file is
    refused here, rather than as a TLS failure that would not say why."""
    env = os.environ if env is None else env
    chosen = ca_bundle or env.get(CA_BUNDLE_VARIABLE) or None
    if chosen is None:
        return True
    path = Path(chosen).expanduser()
    if not path.is_file():
        raise BadRequest(0, "bad_ca_bundle",
                         f"the CA bundle {path} is not a file (--ca-bundle or {CA_BUNDLE_VARIABLE})")
    return str(path)


class Client:
    """Sluice's HTTP API as methods; Cortex's client's names (`get_job`, `create_api`, ...) among them.

    `retries` (a count, or a `RetryPolicy`; 0 disables) says how a request refused as overloaded
    (503 with `Retry-After`) is tried again before `Overloaded` is raised. `ca_bundle`: the CAs an
    https address's certificate is checked against (default: SLUICE_CA_BUNDLE, else the system's).
    """

    def __init__(self, url: str | None = None, timeout: float = 60.0, api_key: str | None = None,
                 retries: int | RetryPolicy = 3, ca_bundle: str | Path | None = None) -> None:
        self.url = (url or default_url()).rstrip("/")
        self.timeout = timeout
        self.retry_policy = retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries=retries)
        self._session = requests.Session()
        # Given with every request: requests lets REQUESTS_CA_BUNDLE override a session's own `verify`.
        self._verify = trusted_cas(ca_bundle)
        # Where each API's jobs are read and stopped: `batch` unless it was found to be a TaskAPI.
        self._job_routes: dict[str, str] = {}
        # Sluice with API keys (api/auth.py) wants one on every call but /healthz.
        api_key = api_key or os.environ.get("SLUICE_API_KEY")
        if api_key:
            self._session.headers["Authorization"] = f"Bearer {api_key}"

    def _request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Send a request; a refusal that asks to be retried (503 + Retry-After) is sent again as
        `self.retry_policy` allows. Any other error answer is raised as its typed `ClientError`."""
        policy = self.retry_policy
        started = policy.clock()
        retry = 0
        while True:
            response = self._send(method, path, **kwargs)
            if response.ok:
                return response
            retry_after = _retry_after_s(response)
            if retry_after is None or retry >= policy.retries:
                raise _error_of(response)
            wait = policy.delay(retry, retry_after)
            if policy.clock() - started + wait > policy.max_total:
                raise _error_of(response)
            response.close()
            policy.sleep(wait)
            retry += 1

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        try:
            return self._session.request(method, f"{self.url}{path}", timeout=self.timeout, verify=self._verify,
                                         **kwargs)
        except requests.exceptions.SSLError as e:
            raise UntrustedCertificate(0, "untrusted_certificate", _tls_failure(self.url, e)) from e
        except requests.ConnectionError as e:
            raise Unreachable(0, "unreachable", f"cannot reach Sluice at {self.url} (is `sluice up` running?)") from e
        except requests.Timeout as e:
            raise Unreachable(0, "unreachable", f"no answer from Sluice at {self.url} within {self.timeout:g}s") from e

    def _absolute(self, endpoint: Any, name: str) -> str:
        """An API's endpoint as an absolute URL: a server before Cortex's shape answered `/<name>`
        (or nothing, for a BatchAPI); such answers are joined to this client's URL."""
        if isinstance(endpoint, str) and endpoint.startswith(("http://", "https://")):
            return endpoint
        if isinstance(endpoint, str) and endpoint.startswith("/"):
            return f"{self.url}{endpoint}"
        return f"{self.url}/{quote(name, safe='')}"

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The JSON object Sluice answered; anything else is a `ServerError` (`bad_response`)."""
        response = self._request(method, path, **kwargs)
        try:
            answer = response.json()
        except ValueError as e:
            raise ServerError(response.status_code, "bad_response", response.text[:500]) from e
        if not isinstance(answer, dict):
            raise ServerError(response.status_code, "bad_response", f"expected a JSON object: {response.text[:500]}")
        return answer

    # -- APIs -------------------------------------------------------------------------------
    def deploy(self, config_path: str | Path = "cortex.yaml", nearest_wheels: bool = False) -> list[dict[str, Any]]:
        """Pack the project folder of `config_path` and deploy every API it lists; with `nearest_wheels`,
        exact pins with no wheel for the server's Python move to the nearest release that has one (and
        pins of Sluice's own libraries to its versions), each move said in the API's `environment`."""
        config_path = Path(config_path)
        if config_path.is_dir():
            config_path = config_path / "cortex.yaml"
        project = pack_project(config_path.parent, config_path)
        return self._deploy(config_path.name, config_path.read_bytes(), project, nearest_wheels)

    def _deploy(self, config_name: str, config_text: bytes, project: bytes,
                nearest_wheels: bool = False) -> list[dict[str, Any]]:
        files = {
            "config": (config_name, config_text, "application/yaml"),
            "project": ("project.tar.gz", project, "application/gzip"),
        }
        data = {"nearest_wheels": "1"} if nearest_wheels else None
        return _records(self._call("POST", "/apis", files=files, data=data), "apis")

    def create_api(
        self, api_spec: dict[str, Any] | list[dict[str, Any]], predictor: Any = None, task: Any = None,
        requirements: list[str] | None = None, conda_packages: list[str] | None = None,
        project_dir: str | Path | None = None, force: bool = True, wait: bool = False,
    ) -> list[dict[str, Any]]:
        """Deploy APIs from their cortex.yaml entries and a project folder (Cortex's signature).

        `api_spec` is one API's entry (or a list of them) as cortex.yaml spells it; the project
        folder (default: the working directory) is packed as `sluice deploy` packs it, and the
        entries are sent as its cortex.yaml. `wait=True` waits until realtime APIs are ready.
        `requirements` are added to the project's `requirements.txt` (its environment is built from
        them, as a deploy's is). Cortex's `predictor=`/`task=` (a pickled class) and
        `conda_packages` have no Sluice equivalent and are refused; `force` is accepted and means
        nothing (a deploy always replaces).
        """
        if predictor is not None or task is not None:
            raise Unsupported(0, "unsupported", "create_api(predictor=/task=) is not supported; pass project_dir= "
                              "with the predictor's file named in api_spec['predictor']['path'] (a TaskAPI's Task: in "
                              "api_spec['definition']['path'])")
        if conda_packages:
            raise Unsupported(0, "unsupported", "create_api(conda_packages=) is not supported; pass them as "
                              "requirements= (pip packages)")
        specs = [api_spec] if isinstance(api_spec, dict) else list(api_spec)
        root = Path(project_dir) if project_dir is not None else Path.cwd()
        config_text = yaml.safe_dump(specs, sort_keys=False).encode()
        # An existing cortex.yaml of the folder is left out of the bundle, as `deploy` does.
        with tempfile.TemporaryDirectory(prefix="sluice-create-api-") as tmp:
            if requirements:
                root = _with_requirements(root, Path(tmp) / "project", requirements)
            deployed = self._deploy("cortex.yaml", config_text, pack_project(root, root / "cortex.yaml"))
        if wait:
            for api in deployed:
                if api["kind"] == ApiKind.REALTIME:
                    self.wait_ready(api["name"])
        return deployed

    def apis(self) -> list[dict[str, Any]]:
        return _records(self._call("GET", "/apis"), "apis")

    def list_apis(self) -> list[dict[str, Any]]:
        """Every deployed API's summary (name, kind, bundle, queue, deployed_at, spec)."""
        return self.apis()

    def api(self, name: str) -> dict[str, Any]:
        """One API's summary with its absolute `endpoint`; a realtime API's also has its live replicas,
        an AsyncAPI's its `requests` counts and serving `nodes`."""
        answer = self._call("GET", f"/apis/{name}")
        answer["endpoint"] = self._absolute(answer.get("endpoint"), answer.get("name", name))
        return answer

    def get_api(self, api_name: str) -> dict[str, Any]:
        """One API's summary with its absolute `endpoint` (`<url>/<name>`, as Cortex's client gives
        it); a realtime API's also has its live replicas.

        A gRPC API's, as Cortex gave it: `endpoint` the public address's host alone and
        `grpc_ports["insecure"]` its port, so that `endpoint + ":" + str(grpc_ports["insecure"])`
        is where a gRPC channel reaches it (`grpc_ports["secure"]`, for a secure channel, when the
        address serves TLS).
        """
        answer = self.api(api_name)
        if ((answer.get("spec") or {}).get("predictor") or {}).get("protobuf_path"):
            public = urlsplit(self.url)
            host = public.hostname or "localhost"
            answer["endpoint"] = f"[{host}]" if ":" in host else host
            secure = public.scheme == "https"
            answer["grpc_ports"] = {"secure" if secure else "insecure": public.port or (443 if secure else 80)}
        return answer

    def delete_api(self, api_name: str, force: bool = False, keep_cache: bool = False) -> dict[str, Any]:
        """Delete an API; `force` stops its running jobs first (else a running job is a Conflict).

        `keep_cache` is Cortex's and means nothing here.
        """
        return self._call("DELETE", f"/apis/{api_name}", params={"force": "true"} if force else None)

    # -- realtime ---------------------------------------------------------------------------
    def predict(
        self, api_name: str, payload: Any, params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """POST `payload` as JSON to a realtime API; its answer (parsed JSON, else text or bytes)."""
        return self.predict_raw(api_name, json.dumps(payload).encode(), "application/json", params, headers)

    def predict_raw(
        self, api_name: str, body: bytes, content_type: str, params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """POST a body as it is to a realtime API; its answer (parsed JSON, else text or bytes)."""
        response = self._request("POST", f"/{api_name}", data=body, params=params,
                                 headers={"Content-Type": content_type, **(headers or {})})
        answer_type = response.headers.get("Content-Type", "")
        if answer_type.startswith("application/json"):
            return response.json()
        if answer_type.startswith("text/"):
            return response.text
        return response.content

    def readiness(self, api_name: str) -> dict[str, Any]:
        """`GET /<api_name>`: the API's readiness and models; raises NotReady (503) until ready."""
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

    # -- AsyncAPI requests -------------------------------------------------------------------
    def submit_async(self, api_name: str, payload: Any, request_id: str | None = None,
                     content_type: str | None = None, idempotency_key: str | None = None) -> str:
        """Submit one request to an AsyncAPI; returns its id. `payload` goes as JSON, or as it is when
        it is `bytes` (application/octet-stream) or `str` (text/plain), unless `content_type` says.
        Sent with an `Idempotency-Key` (`idempotency_key`, else a new one) that its retries reuse."""
        if isinstance(payload, bytes):
            body, kind = payload, "application/octet-stream"
        elif isinstance(payload, str):
            body, kind = payload.encode(), "text/plain; charset=utf-8"
        else:
            body, kind = json.dumps(payload).encode(), "application/json"
        headers = {"Content-Type": content_type or kind, IDEMPOTENCY_HEADER: idempotency_key or new_idempotency_key()}
        if request_id is not None:
            headers["X-Request-ID"] = request_id
        return str(self._call("POST", f"/{quote(api_name, safe='')}", data=body, headers=headers)["id"])

    def get_async(self, api_name: str, request_id: str) -> dict[str, Any]:
        """`{"id", "status"}`, with `result` and `timestamp` once completed, `message` once failed."""
        return self._call("GET", f"/{quote(api_name, safe='')}/{quote(request_id, safe='')}")

    def wait_async(self, api_name: str, request_id: str, timeout: float | None = 600.0,
                   poll: float = 0.1) -> dict[str, Any]:
        """Poll until the request is completed or failed; returns that answer (TimeoutError past `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            answer = self.get_async(api_name, request_id)
            if answer["status"] in ("completed", "failed"):
                return answer
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"async request {request_id} still {answer['status']} after {timeout:.0f}s")
            time.sleep(poll)

    # -- jobs -------------------------------------------------------------------------------
    def submit_raw(self, api_name: str, body: dict[str, Any], dry_run: bool = False,
                   idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job body; returns the job spec. Sent with an `Idempotency-Key` (`idempotency_key`,
        else a new one) that every retry of this call reuses: a submission refused as unconfirmed
        (503 `not_acknowledged`, which asks to be retried) gives, retried, the job it made, if any."""
        params = {"dryRun": "true"} if dry_run else None
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: idempotency_key or new_idempotency_key()}
        return self._call("POST", f"/batch/{api_name}", data=json.dumps(body), headers=headers, params=params)

    def submit_job(self, api_name: str, job: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job (any submission body Cortex's Batch API takes); returns the job spec. The same
        `idempotency_key` within a day gives the same job (a new key is made when none is given)."""
        return self.submit_raw(api_name, job, idempotency_key=idempotency_key)

    def submit(
        self, api_name: str, items: list[Any], batch_size: int, workers: int = 1,
        config: dict[str, Any] | None = None, timeout: int | None = None, tries: int | None = None,
    ) -> dict[str, Any]:
        """Submit an item list; returns the job spec."""
        return self.submit_raw(api_name, submission_body(items=items, batch_size=batch_size, workers=workers,
                                                         config=config, timeout=timeout, tries=tries))

    def submit_task(self, api_name: str, config: dict[str, Any] | None = None,
                    timeout: int | None = None, idempotency_key: str | None = None) -> dict[str, Any]:
        """Run a TaskAPI's `Task` once (`POST /tasks/<api>`); returns the task job's spec. The same
        `idempotency_key` within a day gives the same task job (a new key is made when none is given)."""
        body = task_submission_body(config, timeout)
        self._job_routes[api_name] = "tasks"
        headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: idempotency_key or new_idempotency_key()}
        return self._call("POST", f"/tasks/{api_name}", data=json.dumps(body), headers=headers)

    def _job_call(self, method: str, api_name: str, **kwargs: Any) -> dict[str, Any]:
        """A call to the API's job endpoint: `/batch/<api>`, or `/tasks/<api>` for a TaskAPI (found
        out, once per client, when `/batch/<api>` answers that the API is not a BatchAPI)."""
        route = self._job_routes.get(api_name, "batch")
        try:
            return self._call(method, f"/{route}/{api_name}", **kwargs)
        except ApiNotFound:
            if route != "batch" or self._call("GET", f"/apis/{quote(api_name, safe='')}").get("kind") != ApiKind.TASK:
                raise
        self._job_routes[api_name] = "tasks"
        return self._call(method, f"/tasks/{api_name}", **kwargs)

    def job(self, api_name: str, job_id: str) -> dict[str, Any]:
        """The job's bare `job_status` (status, worker_counts, times; a batch job's batch_metrics): Sluice's own."""
        status: dict[str, Any] = self.get_job(api_name, job_id)["job_status"]
        return status

    def get_job(self, api_name: str, job_id: str) -> dict[str, Any]:
        """The job as Cortex's client returned it: `{"job_status", "endpoint", "api_spec"}`, what
        `GET /batch/<api>?jobID=` (a TaskAPI's: `GET /tasks/<api>?jobID=`) answers, with `endpoint`
        an absolute URL."""
        answer = self._job_call("GET", api_name, params={"jobID": job_id})
        answer["endpoint"] = self._absolute(answer.get("endpoint"), api_name)
        return answer

    def jobs(self, api_name: str, limit: int = 100) -> list[dict[str, Any]]:
        """The API's jobs, newest first (a BatchAPI's or a TaskAPI's)."""
        return _records(self._job_call("GET", api_name, params={"limit": limit}), "jobs")

    def stop(self, api_name: str, job_id: str) -> dict[str, Any]:
        """Stop a batch or task job."""
        return self._job_call("DELETE", api_name, params={"jobID": job_id})

    def stop_job(self, api_name: str, job_id: str, keep_cache: bool = False) -> dict[str, Any]:
        """Stop a running job; a job that already ended is a Conflict."""
        return self.stop(api_name, job_id)

    def failed_batches(self, api_name: str, job_id: str) -> list[dict[str, Any]]:
        """A batch job's batches that failed after all their tries (a task job has none to list)."""
        if self._job_routes.get(api_name) == "tasks":
            return []
        return _records(self._call("GET", f"/batch/{api_name}/failed", params={"jobID": job_id}), "failed_batches")

    # -- logs -------------------------------------------------------------------------------
    def get_logs(
        self, api_name: str, job_id: str | None = None, after: str | None = None, limit: int | None = None,
    ) -> dict[str, Any]:
        """A page of log lines, oldest first: a batch or task job's (with `job_id`), or a realtime API's
        or an AsyncAPI's (without).

        Returns `{"lines": [...the JSON lines as logged...], "next": position}`; pass `next` back
        as `after` to get only the lines written since.
        """
        name = quote(api_name, safe="")
        path = f"/batch/{name}/{quote(job_id, safe='')}/logs" if job_id else f"/apis/{name}/logs"
        params = {key: value for key, value in (("after", after), ("limit", limit)) if value is not None}
        return self._call("GET", path, params=params or None)

    def get_async_logs(self, api_name: str, request_id: str, after: str | None = None,
                       limit: int | None = None) -> dict[str, Any]:
        """A page of an AsyncAPI request's log lines (the node's while it ran the request), as `get_logs`."""
        path = f"/apis/{quote(api_name, safe='')}/requests/{quote(request_id, safe='')}/logs"
        params = {key: value for key, value in (("after", after), ("limit", limit)) if value is not None}
        return self._call("GET", path, params=params or None)

    def wait(
        self, api_name: str, job_id: str, timeout: float | None = 600.0, poll: float = 0.25,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends; returns its final `job_status` (TimeoutError past `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.job(api_name, job_id)
            if on_progress is not None:
                on_progress(status)
            if status["status"] in TERMINAL_STATUSES:
                return status
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {status['status']} after {timeout:.0f}s")
            time.sleep(poll)

    def wait_job(self, api_name: str, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """Wait until the job ends (forever unless `timeout` seconds); its final `job_status`."""
        return self.wait(api_name, job_id, timeout=timeout)


def client(url: str | None = None, retries: int | RetryPolicy = 3, ca_bundle: str | Path | None = None) -> Client:
    """A client for the Sluice at `url`, else SLUICE_URL, else SLUICE_API_URL, else the local default."""
    return Client(url, retries=retries, ca_bundle=ca_bundle)
