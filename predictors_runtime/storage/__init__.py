"""Storage backends chosen by URI scheme: local paths, `s3://` and `gs://`; see `storage_for`."""

from .base import ObjectInfo, Storage, join_uri, split_uri, storage_for

__all__ = ["ObjectInfo", "Storage", "join_uri", "split_uri", "storage_for"]
