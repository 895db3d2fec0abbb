"""A certificate and its key for HTTPS: checked before serving, then handed to uvicorn.

The job service, the model server and a deployment's front serve HTTPS the same way, through
uvicorn's ``ssl_certfile``/``ssl_keyfile``. The pair is loaded here first, so that a missing file,
a key of another certificate or a key behind a passphrase ends the command with a message naming
the file, instead of a traceback from inside uvicorn's start-up (or a passphrase prompt).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ringtrain.errors import ConfigError

#: TLS 1.2 suites offered besides TLS 1.3's own (which OpenSSL always offers): forward-secret
#: AEAD ones only. uvicorn's default ("TLSv1") would also offer CBC suites with SHA-1.
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


@dataclass(frozen=True)
class TlsFiles:
    """A checked certificate (PEM, the server's first, then any intermediates) and its key."""

    cert: Path
    key: Path

    def uvicorn_options(self) -> dict[str, Any]:
        """The keyword arguments of ``uvicorn.Config`` that serve HTTPS with this pair."""
        return {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key),
                "ssl_ciphers": CIPHERS}

    def certificate_der(self) -> bytes:
        """The server's own certificate (the file's first) as DER bytes, for its fingerprint."""
        pem = self.cert.read_text(errors="replace")
        begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
        # The first block only (a chain file goes on with its CAs), without what precedes it
        # (openssl's "Bag Attributes" lines, say).
        start = pem.index(begin)
        return ssl.PEM_cert_to_DER_cert(pem[start:pem.index(end, start) + len(end)])


def tls_files(cert: str | Path | None, key: str | Path | None) -> TlsFiles | None:
    """The pair of ``--cert``/``--key``, checked; ``None`` when neither is given.

    Raises:
        ConfigError: only one is given, a file cannot be read, the certificate is not PEM, the
            key is not the certificate's, or the key needs a passphrase.
    """
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("--cert and --key go together: the certificate (PEM) and its "
                          "private key")
    files = TlsFiles(Path(cert).expanduser().resolve(), Path(key).expanduser().resolve())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # The callback answers a passphrase prompt with nothing: an encrypted key fails here
        # rather than waiting for someone to type at a server's terminal.
        files.certificate_der()  # first: a file that is no certificate is said to be one
        context.load_cert_chain(files.cert, files.key, password=lambda: b"")
    except OSError as e:
        problem = e.strerror or str(e)
        if isinstance(e, ssl.SSLError):
            problem = (f"{e.reason or e}: the key must be the certificate's, in PEM, without a "
                       "passphrase")
        raise ConfigError(f"cannot serve HTTPS with certificate {files.cert} and key "
                          f"{files.key}: {problem}") from None
    except ValueError:
        raise ConfigError(f"{files.cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
                          ) from None
    return files
