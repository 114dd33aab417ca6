"""The certificate files of the public address: the pair given is checked at the edge, a renewal
half-written keeps the last good pair served, and `--tls self-signed`'s CA signs a certificate
that a client trusting only that CA accepts for every name asked."""

from __future__ import annotations

import os
import ssl

import pytest
from cryptography import x509

from sluice.client import BadRequest, trusted_cas
from sluice.tls.self_signed import make_self_signed
from sluice.tls.served import ServedCertificate, TlsFilesError


def test_a_self_signed_ca_signs_a_server_certificate_for_every_name_and_is_kept(tmp_path):
    made = make_self_signed(tmp_path, ["localhost", "127.0.0.1", "::1"])
    ca = x509.load_pem_x509_certificate(made.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(made.cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    # Python's own TLS stack takes the CA, and the pair, as they are written.
    ssl.create_default_context(cafile=str(made.ca))
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(made.cert), str(made.key))
    assert oct(made.key.stat().st_mode & 0o777) == "0o600"
    # Asked again for the same names: nothing is made anew; for one more: a new certificate, same CA.
    stamp = made.cert.stat().st_mtime_ns
    assert make_self_signed(tmp_path, ["localhost", "127.0.0.1", "::1"]) == made
    assert made.cert.stat().st_mtime_ns == stamp
    make_self_signed(tmp_path, ["localhost", "sluice.test"])
    assert x509.load_pem_x509_certificate(made.ca.read_bytes()) == ca
    renewed = x509.load_pem_x509_certificate(made.cert.read_bytes())
    assert renewed.serial_number != cert.serial_number
    renewed.verify_directly_issued_by(ca)


def test_a_pair_that_cannot_be_served_is_refused_naming_the_file(tmp_path):
    one = make_self_signed(tmp_path / "one", ["localhost"])
    other = make_self_signed(tmp_path / "other", ["localhost"])
    with pytest.raises(TlsFilesError, match=f"the key in {other.key} is not the key of the certificate in {one.cert}"):
        ServedCertificate(one.cert, other.key, tmp_path / "state").load()
    with pytest.raises(TlsFilesError, match=f"{one.key} holds no PEM certificate"):
        ServedCertificate(one.key, one.key, tmp_path / "state").load()
    with pytest.raises(TlsFilesError, match="cannot read .*missing.pem"):
        ServedCertificate(tmp_path / "missing.pem", one.key, tmp_path / "state").load()


def test_a_renewal_is_taken_once_both_halves_agree_and_the_last_good_pair_stays_meanwhile(tmp_path):
    made = make_self_signed(tmp_path / "made", ["localhost"])
    served = ServedCertificate(made.cert, made.key, tmp_path / "state")
    served.load()
    first, combined = served.digest, served.combined.read_bytes()
    assert combined.startswith(b"-----BEGIN CERTIFICATE-----") and b"PRIVATE KEY" in combined
    assert oct(served.combined.stat().st_mode & 0o777) == "0o600"
    assert served.refresh() is False  # nothing changed on disk

    # The new key lands first: the pair disagrees, the old one stays served.
    other = make_self_signed(tmp_path / "other", ["localhost"])
    os.replace(other.key, made.key)
    assert served.refresh() is False
    assert (served.digest, served.combined.read_bytes()) == (first, combined)
    # Then its certificate: the new pair is taken.
    os.replace(other.cert, made.cert)
    assert served.refresh() is True
    assert served.digest != first and served.combined.read_bytes() != combined


def test_a_ca_bundle_that_is_not_a_file_is_refused_before_any_connection(tmp_path):
    assert trusted_cas(None, env={}) is True
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    assert trusted_cas(None, env={"SLUICE_CA_BUNDLE": str(bundle)}) == str(bundle)
    assert trusted_cas(bundle, env={"SLUICE_CA_BUNDLE": "/elsewhere"}) == str(bundle)
    with pytest.raises(BadRequest, match="the CA bundle .*nowhere.pem is not a file"):
        trusted_cas(tmp_path / "nowhere.pem", env={})
