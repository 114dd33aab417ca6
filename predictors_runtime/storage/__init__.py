"""Storage backends chosen by URI scheme; see `open_storage`."""

from .base import Storage, open_storage

__all__ = ["Storage", "open_storage"]
