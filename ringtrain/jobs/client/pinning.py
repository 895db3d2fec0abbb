"""Trusting an https job server by the fingerprint of its certificate (a pin), as ssh trusts a
host key.

A self-signed certificate has no CA to vouch for it, so the client checks that the server shows
exactly the certificate whose fingerprint it was given (``ringtrain login``'s record,
``--fingerprint``, ``RINGTRAIN_FINGERPRINT``). The certificate is read once from the server
(:func:`peer_certificate`: a handshake that checks nothing), compared with the pin, and then made
the one trust anchor of the context every connection of the client uses
(:func:`pinned_context`), so a server that later shows another certificate fails the handshake
itself: what was compared is what is trusted, with no window in between. Host names are not
checked: the pin is the identity, and a client may reach a server by an address its certificate
does not name.
"""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit

from ringtrain.jobs.cert_fingerprint import fingerprint_of, parse_fingerprint
from ringtrain.jobs.errors import CertificateError, ServiceUnavailableError


def peer_certificate(url: str, timeout_s: float = 10.0) -> bytes:
    """The certificate the server of an https ``url`` shows, as DER bytes, unchecked.

    Raises:
        ServiceUnavailableError: nothing answers there, or not with TLS.
    """
    host, port = _address(url)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # read, not trusted: the caller compares it with a pin
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError) as e:
        raise ServiceUnavailableError(f"cannot reach the job service at {url} over TLS: "
                                      f"{e}") from None
    if not der:
        raise ServiceUnavailableError(f"the server at {url} showed no certificate")
    return der


def pinned_context(url: str, fingerprint: str, timeout_s: float = 10.0) -> ssl.SSLContext:
    """A client context that trusts only the certificate ``url`` shows now, once its fingerprint
    was found to be ``fingerprint``.

    Raises:
        CertificateError: the server shows another certificate (both fingerprints named).
        InvalidRequestError: ``fingerprint`` is not a fingerprint.
        ServiceUnavailableError: the server cannot be reached.
    """
    expected = parse_fingerprint(fingerprint)
    der = peer_certificate(url, timeout_s)
    if fingerprint_of(der) != expected:
        raise mismatch(url, expected, fingerprint_of(der))
    context = ssl.create_default_context(cadata=der)
    context.check_hostname = False
    # The pinned certificate may be a CA-issued one (``--cert``) rather than self-signed:
    # accept a chain that ends at it instead of at a root.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def mismatch(url: str, expected: str, got: str) -> CertificateError:
    """The error for a server whose certificate is not the pinned one."""
    return CertificateError(
        f"the job service at {url} shows a certificate other than the one pinned for it: "
        f"expected {expected}, got {got}. Either its certificate changed (a new one was made) or "
        f"something between you and it is not the server. Check the new fingerprint with the "
        f"server's owner (`ringtrain server status` on its host prints it); if it is theirs, pin "
        f"it: `ringtrain login {url} --fingerprint {got}` (or set RINGTRAIN_FINGERPRINT)")


def explain_failed_handshake(url: str, fingerprint: str | None, cause: BaseException
                             ) -> CertificateError | None:
    """Why an https connection failed its certificate check, or ``None`` if it was not that.

    With a pin, the certificate the server shows now is read again, to name both fingerprints.
    Without one, the server's certificate is not vouched for by a CA, so the message says how
    to pin it.
    """
    if not _is_certificate_failure(cause):
        return None
    if fingerprint is not None:
        try:
            got = fingerprint_of(peer_certificate(url))
        except ServiceUnavailableError:
            got = "(the server could not be reached again)"
        return mismatch(url, parse_fingerprint(fingerprint), got)
    return CertificateError(
        f"the job service at {url} shows a certificate that no CA of this machine vouches for "
        f"(a self-signed one, say): pin it by its fingerprint, which its owner reads with "
        f"`ringtrain server status`: `ringtrain login {url} --fingerprint SHA256:...`, or "
        f"--fingerprint / RINGTRAIN_FINGERPRINT with --url / RINGTRAIN_URL")


def _is_certificate_failure(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 10:  # httpx wraps the ssl error once or twice
        if isinstance(error, ssl.SSLCertVerificationError):
            return True
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"not an https URL: {url}")
    return parts.hostname, parts.port or 443
