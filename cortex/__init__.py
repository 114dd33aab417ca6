"""`import cortex; cortex.client()`: Cortex's Python client, answered by Sluice.

Predictors written for Cortex call `cortex.client().create_api(...)`, `get_api`, `list_apis`,
`get_job`, `delete_api` and `stop_job` (e.g. from `on_job_complete`); those work unchanged
against the Sluice that runs them.
"""

from __future__ import annotations

from sluice.client import Client, ClientError

__all__ = ["Client", "ClientError", "client"]


def client(env: str | None = None) -> Client:
    """A client of the Sluice that runs this code (SLUICE_URL, else SLUICE_API_URL).

    Cortex names an environment here; Sluice has no environments, so `env` is used only when it
    is a URL (`http://...`) and otherwise ignored.
    """
    url = env if env and env.startswith(("http://", "https://")) else None
    return Client(url)
