"""The job server's TLS certificate: one given (``--cert/--key``), or a self-signed one made once
in the home (``ringtrain server --tls``).

A self-signed certificate is only as good as the clients' check of it, so its identity is its
fingerprint (:mod:`ringtrain.jobs.cert_fingerprint`), which the server prints and records and
clients pin (``ringtrain login URL --fingerprint ...``), as ssh pins a host key. It is made once,
in ``HOME/tls/`` (the key mode 600), and reused by every later start: a new certificate at each
start would make every client refuse the server. Delete the folder to make a new one (then every
client must pin the new fingerprint). The certificate names ``localhost``, 127.0.0.1, ::1 and the
names the first ``--tls`` start was given (``--public-host``, ``--host``), so that browsers and
``curl --cacert`` can check it too; ringtrain's clients check the pin, not the name.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from ringtrain.errors import ConfigError
from ringtrain.jobs.cert_fingerprint import fingerprint_of
from ringtrain.jobs.home import Home
from ringtrain.web.tls_files import TlsFiles, tls_files

#: A self-signed certificate's validity. Clients trust it by its pin, not its dates, but
#: OpenSSL still refuses an expired one, so it outlives any server; rotation is deleting it.
VALID_DAYS = 3650
_WILDCARDS = ("0.0.0.0", "::")


@dataclass(frozen=True)
class ServerCertificate:
    """The pair a server serves HTTPS with, and the fingerprint clients pin."""

    files: TlsFiles
    fingerprint: str
    self_signed: bool


@dataclass(frozen=True)
class CertificateSource:
    """Where a server's certificate comes from: the files given (``--cert/--key``), or, with
    neither, the home's self-signed one."""

    cert: Path | None = None
    key: Path | None = None

    def load(self, home: Home, names: tuple[str, ...] = ()) -> ServerCertificate:
        """The certificate, checked; a self-signed one made now if the home has none (naming
        ``names`` besides the loopback ones).

        Raises:
            ConfigError: the pair cannot serve HTTPS (the message says why).
        """
        if self.cert is None and self.key is None:
            return home_certificate(home, names)
        return given_certificate(self.cert, self.key)


def given_certificate(cert: str | Path | None, key: str | Path | None) -> ServerCertificate:
    """The certificate of ``--cert``/``--key``, checked (see
    :func:`ringtrain.web.tls_files.tls_files`).

    Raises:
        ConfigError: one of the two is missing, or the pair cannot serve HTTPS (the message
            says why).
    """
    files = tls_files(cert, key)
    if files is None:
        raise ConfigError("--cert and --key go together: the certificate (PEM) and its key")
    return ServerCertificate(files, fingerprint_of(files.certificate_der()), self_signed=False)


def home_certificate(home: Home, names: tuple[str, ...] = ()) -> ServerCertificate:
    """The home's self-signed certificate, made on first use with ``names`` (host names or
    addresses) besides the loopback ones, and reused as it is afterwards.

    Only the server of the home calls it, under the home's lock, so no two processes make one
    at once; each file is still written to a temporary name and renamed, so that a server
    killed half-way leaves none rather than half of one.

    Raises:
        ConfigError: the stored pair cannot serve HTTPS (the message names the files).
    """
    folder = home.tls_folder
    cert, key = folder / "cert.pem", folder / "key.pem"
    if not (cert.exists() and key.exists()):
        home.ensure()
        folder.mkdir(mode=0o700, exist_ok=True)
        cert_pem, key_pem = _self_signed(names)
        _write(key, key_pem)  # the key first: a certificate without its key is useless
        _write(cert, cert_pem)
    files = tls_files(cert, key)
    assert files is not None, "both paths were given"
    return ServerCertificate(files, fingerprint_of(files.certificate_der()), self_signed=True)


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a crashed write's leftover keeps its own mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _self_signed(names: tuple[str, ...]) -> tuple[bytes, bytes]:
    """A new ECDSA P-256 key and a certificate of it signed by itself, both PEM."""
    # Imported here: only a first `--tls` start needs the package.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"),
                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                    x509.IPAddress(ipaddress.ip_address("::1"))]
    for name in dict.fromkeys(names):
        if not name or name in _WILDCARDS or name == "localhost":
            continue
        try:
            address = x509.IPAddress(ipaddress.ip_address(name.strip("[]")))
        except ValueError:
            sans.append(x509.DNSName(name))
        else:
            if address not in sans:
                sans.append(address)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ringtrain job service")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little behind
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem
