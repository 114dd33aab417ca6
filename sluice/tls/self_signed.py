"""A CA and a server certificate made for trying TLS out (`sluice up --tls self-signed`).

The CA's certificate is what a client is handed to trust (`--ca-bundle`, `SLUICE_CA_BUNDLE`); its
key stays in the same folder and signs the server's certificate again when that one nears its end
or does not name every address asked for. Both are kept across restarts, so a client given the CA
once keeps trusting the stack. It is no substitute for a certificate from the team's own CA: the
CA's key sits on the host that serves.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_DAYS = 365
# A server certificate this close to its end is made again at the next start.
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class SelfSigned:
    """The files `make_self_signed` keeps: the CA to trust, and the pair the proxy serves."""

    ca: Path
    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _write(path: Path, data: bytes, private: bool = False) -> None:
    temporary = path.with_name(f".{path.name}.new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _make_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Sluice self-signed CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sluice")])
    now = _now()
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(folder / "ca-key.pem", _key_pem(key), private=True)
    _write(folder / "ca.pem", cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _load_ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    try:
        cert = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca-key.pem").read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.not_valid_after_utc - RENEW_BEFORE < _now():
        return None
    return cert, key


def _server_is_current(folder: Path, ca: x509.Certificate, hosts: Sequence[str]) -> bool:
    """Whether the kept server certificate was signed by `ca`, names every host and is not near its end."""
    try:
        cert = x509.load_pem_x509_certificate((folder / "cert.pem").read_bytes())
        (folder / "key.pem").stat()
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    return (cert.issuer == ca.subject and cert.not_valid_after_utc - RENEW_BEFORE > _now()
            and all(name in names for name in _names(hosts)))


def make_self_signed(folder: Path, hosts: Sequence[str]) -> SelfSigned:
    """The CA and server certificate in `folder`, made (or the server's made again) as needed; the
    server's certificate names every one of `hosts` (names and IP addresses)."""
    folder.mkdir(parents=True, exist_ok=True)
    found = SelfSigned(folder / "ca.pem", folder / "cert.pem", folder / "key.pem")
    loaded = _load_ca(folder)
    if loaded is None:
        loaded = _make_ca(folder)
    elif _server_is_current(folder, loaded[0], hosts):
        return found
    ca_cert, ca_key = loaded
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
        .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(found.key, _key_pem(key), private=True)
    _write(found.cert, cert.public_bytes(serialization.Encoding.PEM))
    return found
