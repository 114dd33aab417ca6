"""Prometheus metrics of the API process."""

from __future__ import annotations

from prometheus_client import Counter

JOBS_SUBMITTED = Counter("sluice_jobs_submitted", "Batch jobs submitted", ["api"])
HTTP_RESPONSES = Counter("sluice_http_responses", "HTTP responses by status class", ["status"])
