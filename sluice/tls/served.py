"""The certificate and key the proxy serves, checked at the edge and watched for a swap on disk.

haproxy wants one PEM file holding the chain and its key, so the controller writes the pair given
(`--tls-cert`, `--tls-key`) into one file of its state folder, and names the pair's digest in the
configuration it renders: a certificate renewed on disk changes the configuration, which the
controller reloads gracefully, as it does for new routes (no connection refused, none cut).

A pair is read again only when a file's size, inode or modification time changed; a pair that does
not load, or whose key does not match its certificate (a renewal caught half-written), keeps the
certificate served before it until both halves agree.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from foundation.errors import ConfigError

log = logging.getLogger(__name__)

COMBINED_NAME = "public.pem"


class TlsFilesError(ConfigError):
    """A certificate or key given for the public address cannot be served."""

    kind = "invalid_tls_files"


def _stamp(path: Path) -> tuple[int, int, int]:
    found = path.stat()
    return found.st_ino, found.st_size, found.st_mtime_ns


def check_pair(cert_pem: bytes, key_pem: bytes, cert_path: Path, key_path: Path) -> None:
    """Raise `TlsFilesError` (naming the file) unless `cert_pem` is a PEM certificate chain and
    `key_pem` the unencrypted private key of its first certificate."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError as e:
        raise TlsFilesError(f"{cert_path} holds no PEM certificate: {e}") from e
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError as e:
        raise TlsFilesError(f"{key_path} is encrypted with a passphrase; the proxy needs it unencrypted") from e
    except ValueError as e:
        raise TlsFilesError(f"{key_path} holds no PEM private key: {e}") from e
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    served = chain[0].public_key().public_bytes(serialization.Encoding.DER,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
    if public != served:
        raise TlsFilesError(f"the key in {key_path} is not the key of the certificate in {cert_path}")


@dataclass
class ServedCertificate:
    """The pair given for the public address, and the one file haproxy loads it from.

    `refresh()` is called every turn of the controller's loop; it costs two `stat` calls unless a
    file changed. `digest` names the pair last found whole (it goes into the configuration).
    """

    cert: Path
    key: Path
    folder: Path
    digest: str = ""
    _stamps: tuple[tuple[int, int, int], tuple[int, int, int]] | None = field(default=None, repr=False)

    @property
    def combined(self) -> Path:
        """The file haproxy's `crt` names: the chain, then its key (mode 0600)."""
        return self.folder / COMBINED_NAME

    def load(self) -> None:
        """Read and check the pair and write the combined file; `TlsFilesError` when it cannot be served."""
        try:
            stamps = (_stamp(self.cert), _stamp(self.key))
            cert_pem, key_pem = self.cert.read_bytes(), self.key.read_bytes()
        except OSError as e:
            raise TlsFilesError(f"cannot read {e.filename}: {e.strerror}") from e
        check_pair(cert_pem, key_pem, self.cert, self.key)
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()[:16]
        if digest != self.digest:
            _write_private(self.combined, cert_pem.rstrip(b"\n") + b"\n" + key_pem)
            self.digest = digest
        self._stamps = stamps

    def refresh(self) -> bool:
        """Whether a changed pair was taken (the configuration then names a new digest). A pair that
        cannot be served is logged and left for the next turn; the last good one stays served."""
        try:
            if self._stamps == (_stamp(self.cert), _stamp(self.key)):
                return False
        except OSError:
            pass  # a file renamed over mid-swap: load() says what is wrong, if it still is
        before = self.digest
        try:
            self.load()
        except TlsFilesError as e:
            log.warning("the certificate on disk cannot be served yet; serving the previous one: %s", e)
            return False
        if self.digest != before:
            log.info("serving a new certificate from %s (digest %s)", self.cert, self.digest)
        return self.digest != before


def _write_private(path: Path, data: bytes) -> None:
    """Replace `path` atomically with `data`, readable by its owner only (it holds a private key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
