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
    NotAcknowledged,
    NotFound,
    NotReady,
    Overloaded,
    PredictorError,
    RequestTimeout,
    RetryPolicy,
    ServerError,
    Unreachable,
    UntrustedCertificate,
    client,
)

__all__ = [
    "ApiNotFound", "BadRequest", "Client", "ClientError", "Conflict", "InvalidConfig", "InvalidModelInput",
    "JobNotFound", "ModelNotFound", "NotAcknowledged", "NotFound", "NotReady", "Overloaded", "PredictorError",
    "RequestTimeout", "RetryPolicy", "ServerError", "Unreachable", "UntrustedCertificate", "client",
]
