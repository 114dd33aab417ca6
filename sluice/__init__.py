"""Sluice's user-facing surface: the `sluice` command and `sluice.client()`."""

from .client import Client, ClientError, client

__all__ = ["Client", "ClientError", "client"]
