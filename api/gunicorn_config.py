"""How gunicorn serves the management API: `gunicorn -c python:api.gunicorn_config 'api:create_app()'`.

Threads, with keep-alive. The proxy in front of the API keeps its connections to it open and sends
request after request on them; gunicorn's sync worker closes every connection after one answer, so
each request cost a new TCP connection on both sides, an accept, and a graceful close that waits
for the proxy's FIN. Under `bench/async_api.py`'s stream of AsyncAPI submissions that was about a
quarter of the API's and the proxy's CPU per request. Threads also let one process answer others
while a slow request (a deploy's upload, a long read of logs) runs.

Options given on the command line (`-b`, `-w`) win over these.
"""

from __future__ import annotations

from typing import Any

worker_class = "gthread"
workers = 2
threads = 4
# Longer than the proxy keeps an idle connection to a server, so that the proxy is the side that
# closes it: a request is never sent on a connection the API is closing at that moment.
keepalive = 75
timeout = 120
graceful_timeout = 10


def post_worker_init(worker: Any) -> None:
    """Each API process starts its JSON-lines parsing helpers as it starts (`jobs/batch/line_checks.py`),
    so that its first large `delimited_files` job does not wait for them."""
    from jobs.batch.line_checks import LINE_CHECKS

    LINE_CHECKS.start()
