"""Access to the per-app services from request handlers."""

from __future__ import annotations

from flask import current_app

from jobs.services import Services

from foundation.api_registry import ApiRegistry


def services() -> Services:
    return current_app.extensions["sluice"]


def registry() -> ApiRegistry:
    return current_app.extensions["sluice.registry"]
