"""Bounds that more than one layer enforces: the settings take their defaults from here, the
runtime checks projects and configs against them, the HTTP API sizes request bodies by them.

Each lives here once so that the check and the default cannot drift apart.
"""

from __future__ import annotations

# The longest a batch (`batch_timeout`, `SLUICE_BATCH_TIMEOUT`) may be allowed to run.
MAX_BATCH_TIMEOUT_S = 24 * 3600
# A packed project (a deploy's upload).
MAX_BUNDLE_BYTES = 200 * 1024 * 1024
# What a bundle may hold once unpacked. The packed limit counts compressed bytes, and a 1 MB
# upload of zeros can declare a 1 GiB file: these bound the disk a deploy (and every worker that
# unpacks it) can be made to fill, and the inodes.
MAX_UNPACKED_BYTES = 1024 * 1024 * 1024
MAX_BUNDLE_FILES = 100_000
# Unpacked bundles a host keeps (`SLUICE_BUNDLE_CACHE_BYTES`); bundles in use may exceed it.
DEFAULT_BUNDLE_CACHE_BYTES = 5 * 1024**3

# An AsyncAPI request's payload up to this size sits in its Redis record; a larger one goes to storage.
ASYNC_INLINE_PAYLOAD_BYTES = 16 * 1024
# The same for a completed request's result (its JSON): small ones are read with the record, in one
# round trip, and no object is written per request; a larger one goes to storage.
ASYNC_INLINE_RESULT_BYTES = 16 * 1024
# Cortex kept an AsyncAPI's results 7 days (`SLUICE_ASYNC_RETENTION_S`).
DEFAULT_ASYNC_RETENTION_S = 7 * 24 * 3600.0
