"""Sluice's HTTP API: `gunicorn 'api:create_app()'`."""

from .app import create_app

__all__ = ["create_app"]
