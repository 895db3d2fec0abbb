"""Where the job service keeps its state, and the only place its own settings are read.

``RINGTRAIN_HOME`` (default ``~/.ringtrain``) holds the SQLite database, the share root with one
folder per job, and the running server's address in ``server.json``. The variables' names are
defined in :mod:`ringtrain.jobs.envvars`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ringtrain.jobs import envvars
from ringtrain.jobs.errors import InvalidRequestError


@dataclass(frozen=True)
class Home:
    """The paths of one service home. Nothing is created until :meth:`ensure` is called."""

    root: Path

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Home:
        """The home named by ``RINGTRAIN_HOME``, else ``~/.ringtrain``, as an absolute path."""
        environ = os.environ if environ is None else environ
        raw = environ.get(envvars.HOME) or str(Path.home() / ".ringtrain")
        return cls(Path(raw).expanduser().resolve())

    @property
    def db_path(self) -> Path:
        return self.root / "jobs.sqlite"

    @property
    def share_root(self) -> Path:
        return self.root / "share"

    @property
    def server_file(self) -> Path:
        """JSON with the running server's pid, url and token."""
        return self.root / "server.json"

    @property
    def token_file(self) -> Path:
        """The home's bearer token (mode 600), see :mod:`ringtrain.jobs.service.api.auth`."""
        return self.root / "token"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def lock_file(self) -> Path:
        """Held (flock) by the one server of this home while it runs."""
        return self.root / "server.lock"

    @property
    def secrets_folder(self) -> Path:
        """Named secrets for object storage (mode 700), see :mod:`ringtrain.storage.secrets`."""
        return self.root / "secrets"

    @property
    def cache_folder(self) -> Path:
        """The node cache of inputs staged from object storage on this host."""
        return self.root / "cache"

    @property
    def tls_folder(self) -> Path:
        """The server's self-signed certificate and its key (``ringtrain server --tls``)."""
        return self.root / "tls"

    @property
    def reserve_file(self) -> Path:
        """Space the server holds for the records it must keep when the disk fills, given up
        then (:mod:`ringtrain.jobs.service.disk_guard`)."""
        return self.root / "space.reserve"

    @property
    def plans_folder(self) -> Path:
        """Attempts' storage plans (mode 700: they hold credentials)."""
        return self.root / "plans"

    def ensure(self) -> Home:
        """Create the home and share folders; the home is private to the user (the token
        lives there), also when it existed before."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.root.stat().st_mode & 0o077:
            self.root.chmod(0o700)
        self.share_root.mkdir(exist_ok=True)
        return self


def service_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The server URL given by ``RINGTRAIN_URL``, if any."""
    environ = os.environ if environ is None else environ
    return environ.get(envvars.URL) or None


def home_is_named(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``RINGTRAIN_HOME`` names a home: then commands use that home's server rather than
    the service of ``ringtrain login`` (the environment is the more specific choice)."""
    environ = os.environ if environ is None else environ
    return bool(environ.get(envvars.HOME))


def service_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token given by ``RINGTRAIN_TOKEN``, else read from ``RINGTRAIN_TOKEN_FILE``.

    Raises:
        InvalidRequestError: ``RINGTRAIN_TOKEN_FILE`` names a file that cannot be read or is
            empty.
    """
    environ = os.environ if environ is None else environ
    if environ.get(envvars.TOKEN):
        return environ[envvars.TOKEN]
    path = environ.get(envvars.TOKEN_FILE)
    return read_token_file(Path(path), envvars.TOKEN_FILE) if path else None


def service_fingerprint(environ: Mapping[str, str] | None = None) -> str | None:
    """The certificate fingerprint given by ``RINGTRAIN_FINGERPRINT``, as typed (the client
    parses it)."""
    environ = os.environ if environ is None else environ
    return environ.get(envvars.FINGERPRINT) or None


def read_token_file(path: Path, what: str = "token file") -> str:
    """The token in ``path`` (its first line, without surrounding space).

    Raises:
        InvalidRequestError: the file cannot be read, or holds no token; ``what`` names where
            the path came from in the message.
    """
    try:
        with open(path, "rb") as f:
            token = f.read(4096).decode(errors="replace").strip()
    except OSError as e:
        raise InvalidRequestError(f"{what} {path}: cannot read it ({e.strerror})") from None
    if not token:
        raise InvalidRequestError(f"{what} {path} holds no token")
    return token.splitlines()[0].strip()
