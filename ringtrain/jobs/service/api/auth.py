"""Who may call the job service: the home's token, and the Host names the server answers to.

The API starts processes as the service's user, so every request must carry the token, loopback
included: any local account can find a listening port. As in Jupyter, the token is generated
once per home and kept in ``RINGTRAIN_HOME/token``, readable by its owner only; the server
records it in ``server.json`` and the CLI sends it without being asked. It stays the same across
server restarts, so a client that reconnects after one keeps working.

The Host check stops DNS rebinding: a web page whose name resolves to 127.0.0.1 can reach the
port, but its requests name the page's host, which the server refuses.
"""

from __future__ import annotations

import os
import secrets
import stat

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.home import Home
from ringtrain.web.exposure import is_loopback

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_WILDCARDS = ("0.0.0.0", "::")


def home_token(home: Home) -> str:
    """The home's token, generated (and the home created) on first use.

    Creation is atomic and exclusive: the token is written to a private temporary file that is
    then hard-linked into place, so concurrent callers all end up with the one that won.

    Raises:
        RecordError: the token file is not a regular file owned by this user and readable by
            nobody else, or it is empty; the message says to delete it.
    """
    token = _read_token(home)
    if token is not None:
        return token
    home.ensure()
    tmp = home.root / f".token.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, f"{secrets.token_urlsafe(32)}\n".encode())
    finally:
        os.close(fd)
    try:
        os.link(tmp, home.token_file)
    except FileExistsError:
        pass  # another process was first: its token is the home's
    finally:
        tmp.unlink()
    token = _read_token(home)
    assert token is not None, "the token file was just created"
    return token


def _read_token(home: Home) -> str | None:
    path = home.token_file
    advice = "delete it (a new token is generated) and restart the server (`ringtrain server stop`)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP: a symlink
        raise RecordError(f"the token file {path} is not a regular file ({e.strerror}); "
                          f"{advice}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"the token file {path} is not a regular file; {advice}")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise RecordError(f"the token file {path} is readable by other users (mode "
                              f"{stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}); {advice}")
        token = os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not token:
        raise RecordError(f"the token file {path} is empty; {advice}")
    return token


def allowed_hosts(bind_host: str, port: int, public_host: str | None = None) -> frozenset[str]:
    """The ``Host`` header values a server bound to ``bind_host:port`` answers to.

    Loopback names always; besides them ``public_host`` if given, else the bound address itself
    when it is a specific, non-loopback one. Values are lowercase ``name:port``.
    """
    names = set(_LOOPBACK_NAMES)
    if public_host:
        names.add(public_host)
    elif bind_host not in _WILDCARDS and not is_loopback(bind_host):
        names.add(f"[{bind_host}]" if ":" in bind_host else bind_host)
    hosts = {f"{n}:{port}".lower() for n in names}
    if port == 80:  # a client may leave the default port out
        hosts |= {n.lower() for n in names}
    return frozenset(hosts)


def is_wildcard(host: str) -> bool:
    """True for the addresses that bind every interface (``0.0.0.0``, ``::``)."""
    return host in _WILDCARDS
