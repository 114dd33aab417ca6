"""The broker transport: kombu's Redis transport, with one client per channel for its own commands.

Which URLs get it is decided here; the channel itself runs against Redis in
tests/integration/test_broker_redis.py.
"""

from __future__ import annotations

import pytest

from jobs.transport.broker import SENTINEL_TRANSPORT_PATH, TRANSPORT_PATH, transport_for


@pytest.mark.parametrize(
    "url, expected",
    [
        ("redis://127.0.0.1:6379/0", TRANSPORT_PATH),
        ("rediss://cache.example:6380/0", None),
        ("redis+socket:///run/redis.sock", None),
        ("sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379", SENTINEL_TRANSPORT_PATH),
    ],
)
def test_plain_redis_and_sentinel_urls_get_the_sluice_transport(url, expected):
    assert transport_for(url) == expected
