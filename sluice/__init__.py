"""Sluice's user-facing surface: the `sluice` command and `sluice.client()`."""

from .client import (
    ApiNotFound,
    BadRequest,
    Client,
    ClientError,
    Conflict,
    InvalidConfig,
    InvalidModelInput,
    JobNotFound,
    ModelNotFound,
    NotFound,
    NotReady,
    Overloaded,
    PredictorError,
    RequestTimeout,
    RetryPolicy,
    ServerError,
    Unreachable,
    client,
)

__all__ = [
    "ApiNotFound", "BadRequest", "Client", "ClientError", "Conflict", "InvalidConfig", "InvalidModelInput",
    "JobNotFound", "ModelNotFound", "NotFound", "NotReady", "Overloaded", "PredictorError", "RequestTimeout",
    "RetryPolicy", "ServerError", "Unreachable", "client",
]
