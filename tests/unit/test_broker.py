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
        ("rediss://cache.example:6380/0", TRANSPORT_PATH),  # over TLS, the same transport (broker_ssl)
        ("redis+socket:///run/redis.sock", None),
        ("sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379", SENTINEL_TRANSPORT_PATH),
    ],
)
def test_redis_rediss_and_sentinel_urls_get_the_sluice_transport(url, expected):
    assert transport_for(url) == expected


def test_over_tls_the_broker_checks_the_servers_certificate_against_the_ca_given(tmp_path):
    import ssl

    from foundation.settings import Settings
    from jobs.transport.broker import broker_ssl, transport_options

    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    settings = Settings.from_env({"SLUICE_REDIS_URL": "rediss://cache.example:6380/0", "SLUICE_REDIS_CA": str(ca)})
    assert broker_ssl(settings.redis_address) == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    assert broker_ssl(Settings.from_env({}).redis_address) is None
    sentinels = Settings.from_env({"SLUICE_REDIS_SENTINELS": "s1:26379", "SLUICE_REDIS_MASTER": "m",
                                   "SLUICE_REDIS_TLS": "1", "SLUICE_REDIS_CA": str(ca)})
    # The sentinels are asked over TLS too, checking their certificates the same way.
    kwargs = transport_options(sentinels)["sentinel_kwargs"]
    assert (kwargs["ssl"], kwargs["ssl_cert_reqs"], kwargs["ssl_ca_certs"]) == (True, "required", str(ca))
