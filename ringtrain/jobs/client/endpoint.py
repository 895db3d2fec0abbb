"""Which job service a command talks to, when it is not this host's home's server.

The order, first match wins (``connect`` in :mod:`ringtrain.jobs.client.connection` applies it):

1. ``--url`` (with ``--token``, ``--fingerprint``);
2. ``RINGTRAIN_URL`` (with ``RINGTRAIN_TOKEN`` or ``RINGTRAIN_TOKEN_FILE``, and
   ``RINGTRAIN_FINGERPRINT``);
3. a home named by ``RINGTRAIN_HOME`` (or by the caller): that home's server, started if needed;
4. the current service of ``ringtrain login``;
5. the default home's server (``~/.ringtrain``), started if needed.

The environment comes before the remembered login because it is the more specific choice, made
for one shell or one script, as kubectl's flags and ``KUBECONFIG`` come before its current
context. A URL of steps 1-2 that a login recorded takes that login's pin, and its token unless
one is given: ``--url`` alone then reaches a service logged in to.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtrain.jobs.client import services
from ringtrain.jobs.home import service_fingerprint, service_token, service_url


@dataclass(frozen=True)
class Endpoint:
    """A job server and what a client needs to talk to it.

    Attributes:
        url: ``http://`` or ``https://``, host and port.
        token: the bearer token it requires.
        fingerprint: for an https ``url``, the certificate it must show
            (:mod:`ringtrain.jobs.client.pinning`); ``None``: one a CA vouches for.
    """

    url: str
    token: str | None = None
    fingerprint: str | None = None


def given_endpoint(url: str | None = None, token: str | None = None,
                   fingerprint: str | None = None) -> Endpoint | None:
    """Steps 1-2: the server a flag or ``RINGTRAIN_URL`` names, if either does.

    Raises:
        InvalidRequestError: ``RINGTRAIN_TOKEN_FILE`` cannot be read.
        RecordError: the services file is damaged.
    """
    url = url or service_url()
    if not url:
        return None
    token = token or service_token()
    fingerprint = fingerprint or service_fingerprint()
    if token is None or fingerprint is None:
        known = services.service_for_url(url)
        if known is not None:
            token = token or known.token()
            fingerprint = fingerprint or known.fingerprint
    return Endpoint(url, token, fingerprint)


def login_endpoint(token: str | None = None) -> Endpoint | None:
    """Step 4: the current service of ``ringtrain login``, if one is current (``token``, given
    on the command line, replaces its own).

    Raises:
        InvalidRequestError: its token file cannot be read.
        RecordError: the services file is damaged.
    """
    current = services.current_service()
    if current is None:
        return None
    _, record = current
    return Endpoint(record.url, token or record.token(), record.fingerprint)
