"""What the management API answers is a promise: writes confirmed by Redis's replicas, and
submissions made once per `Idempotency-Key`.

Every write answered 2xx (`POST`, `PUT`, `PATCH`, `DELETE`) waits, before its answer leaves, until
the replicas have it (`foundation/acknowledgements.py`); past the wait it is answered 503
`not_acknowledged` instead, with the request's `Idempotency-Key` echoed and `Retry-After`, so that
a client may send it again and get the same job whether or not the first one took.

A batch or task submission with an `Idempotency-Key` claims the key for the job it is about to make
(`foundation/idempotency.py`); the same key within a day answers that job again
(`Idempotent-Replayed: true`), before a failover or after it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from flask import Flask, Response, request

from foundation.errors import Conflict, JobNotFound, NotAcknowledged
from foundation.idempotency import HEADER, STALE_CLAIM_S, checked_key, claimed_at
from jobs.batch.job import Job, new_job_id

from .context import services
from .errors import error_response

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
REPLAYED = "Idempotent-Replayed"


def idempotency_key() -> str | None:
    """This request's `Idempotency-Key`, checked (`BadRequest` for one that cannot be a key)."""
    return checked_key(request.headers.get(HEADER))


def refused_unacknowledged(error: NotAcknowledged, key: str | None) -> Response:
    """The 503 of a write no replica confirmed: with a key to retry by, the client is asked to retry."""
    answer = error_response(error.http_status, error.kind, error.message)
    if key:
        answer.headers[HEADER] = key
        answer.headers["Retry-After"] = "1"
    return answer


def confirm_writes(app: Flask) -> None:
    """Hold every write's 2xx answer until Redis's replicas have it (registered last, so it runs
    before the other after-request hooks see the answer)."""

    @app.after_request
    def _confirmed(response: Response) -> Response:
        if request.method not in WRITES or not 200 <= response.status_code < 300:
            return response
        key = request.headers.get(HEADER) or None
        try:
            services().acknowledgements.confirm(retry_by=key)
        except NotAcknowledged as e:
            return refused_unacknowledged(e, key)
        return response


def replay(answer: Response) -> Response:
    """The answer to a submission whose key was seen before: the first one's job, marked so."""
    answer.headers[REPLAYED] = "true"
    return answer


@dataclass
class Claim:
    """A submission's job id, claimed for its `Idempotency-Key` (if it has one); `replayed`: the key
    was seen before, and `job` is the job its first submission made."""

    job_id: str
    job: Job | None = None

    @property
    def replayed(self) -> bool:
        return self.job is not None


@contextmanager
def idempotent_submission(scope: str, now: float | None = None) -> Iterator[Claim]:
    """The id the submission in the `with` block gives its job, claimed for its `Idempotency-Key`
    within `scope`; with a key seen before, a replayed claim holding that key's job. A block that
    raises gives the key back, so a corrected submission may use it."""
    now = time.time() if now is None else now
    key = idempotency_key()
    candidate = new_job_id(now)
    if key is None:
        yield Claim(candidate)
        return
    keys = services().idempotency
    held = keys.claim(scope, key, candidate)
    if held != candidate:
        try:
            first = services().store.get(held)
        except JobNotFound:
            first = None
        if first is not None:
            yield Claim(held, first)
            return
        made = claimed_at(held)
        if made is not None and now - made < STALE_CLAIM_S:
            raise Conflict(f"a submission with {HEADER} {key} is being made (job {held}); "
                           "retry in a moment for its answer")
        # Its submitter failed or died between the claim and the record: the key is free again.
        if keys.claim(scope, key, candidate, stale=held) != candidate:
            raise Conflict(f"another submission with {HEADER} {key} took it meanwhile; retry for its answer")
    try:
        yield Claim(candidate)
    except BaseException:
        keys.release(scope, key, candidate)
        raise
