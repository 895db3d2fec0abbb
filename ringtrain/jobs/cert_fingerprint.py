"""A TLS certificate's fingerprint: how the job server names its certificate and clients pin it.

One form is written everywhere (the server's log, ``server.json``, ``ringtrain server status``,
``ringtrain login``): ``SHA256:`` and the SHA-256 of the certificate's DER bytes as upper-case
hex pairs joined by colons, as ``openssl x509 -noout -fingerprint -sha256`` prints it, so that
an owner can check it with a tool every host has. The base64 form ``ssh-keygen -l`` prints
(``SHA256:`` and the unpadded base64 of the same digest) is accepted as input too, and so is the
hex without colons or in lower case: people copy fingerprints from all of these. Standard
library only: the client and the server both import it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from ringtrain.jobs.errors import InvalidRequestError, brief

PREFIX = "SHA256:"
_HEX = re.compile(r"^[0-9A-Fa-f]{64}$")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]{43}=?$")
#: What a fingerprint looks like, for messages.
FORMS = ("SHA256: followed by 32 hex pairs separated by colons (as `ringtrain server status` "
         "and `openssl x509 -fingerprint -sha256` print it), or by 43 base64 characters (as "
         "ssh prints fingerprints)")


def fingerprint_of(der: bytes) -> str:
    """The fingerprint of a certificate given as DER bytes, in the form written everywhere."""
    return _format(hashlib.sha256(der).digest())


def parse_fingerprint(text: str) -> str:
    """A fingerprint someone typed or copied, in the form written everywhere.

    Raises:
        InvalidRequestError: ``text`` is neither form (the message shows both).
    """
    value = text.strip()
    if value[:len(PREFIX)].upper() == PREFIX:
        value = value[len(PREFIX):]
    plain = value.replace(":", "")
    if _HEX.match(plain) and (":" not in value or len(value) == 95):
        return _format(bytes.fromhex(plain))
    if _BASE64.match(value):
        try:
            digest = base64.b64decode(value.rstrip("=") + "=", validate=True)
        except binascii.Error:
            digest = b""
        if len(digest) == 32:
            return _format(digest)
    raise InvalidRequestError(f"{brief(text)} is not a certificate fingerprint: expected {FORMS}")


def _format(digest: bytes) -> str:
    return PREFIX + ":".join(f"{b:02X}" for b in digest)
