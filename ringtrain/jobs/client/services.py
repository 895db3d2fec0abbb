"""The job services this user logged in to (``ringtrain login``), by name, and the current one.

As kubectl keeps clusters and a current context, the CLI keeps named services in
``$XDG_CONFIG_HOME/ringtrain/services.json`` (default ``~/.config``): each one's URL, the
fingerprint of the certificate it showed at login (:mod:`ringtrain.jobs.client.pinning`), and
where its token is: the file the user named (``--token-file``: read at each use, never copied),
or a copy of a token given on standard input in ``tokens/<name>``. The file holds no token; it
and every copied token are mode 600, in a folder of mode 700. Every change is written whole and
renamed into place under a lock, so two logins at once never lose one another.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ringtrain.jobs.errors import InvalidRequestError, NotFoundError, RecordError
from ringtrain.jobs.home import read_token_file
from ringtrain.jobs.models.ids import check_name

#: ``ringtrain login --use local`` goes back to this host's home; no service may be called so.
LOCAL = "local"


class ServiceRecord(BaseModel):
    """One service logged in to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    #: The pinned certificate of an https URL; ``None`` for plain HTTP.
    fingerprint: str | None = None
    #: Where the token is (absolute).
    token_file: str
    #: Whether ``token_file`` is the copy kept here (removed by ``logout``), not the user's.
    token_copied: bool = False

    def token(self) -> str:
        """The service's token, read from its file now.

        Raises:
            InvalidRequestError: the file cannot be read or is empty.
        """
        return read_token_file(Path(self.token_file), "the login's token file")


class Services(BaseModel):
    """The file's contents: every service by name, and the one commands use."""

    model_config = ConfigDict(extra="forbid")

    current: str | None = None
    services: dict[str, ServiceRecord] = {}


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/ringtrain`` (default ``~/.config/ringtrain``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ringtrain"


def services_file() -> Path:
    """Where the services are recorded."""
    return config_dir() / "services.json"


def load() -> Services:
    """The recorded services (none if the file does not exist yet).

    Raises:
        RecordError: the file is there but is not a services record (the message names it).
    """
    path = services_file()
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return Services()
    except OSError as e:
        raise RecordError(f"cannot read {path}: {e.strerror}") from None
    try:
        return Services.model_validate_json(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'file'}: {err['msg']}"
                             for err in e.errors()[:5])
        raise RecordError(f"{path} is not a ringtrain services record ({problems}); fix it, or "
                          "delete it and log in again") from None


def current_service() -> tuple[str, ServiceRecord] | None:
    """The current service and its name, if a login made one current."""
    services = load()
    if services.current is None or services.current not in services.services:
        return None
    return services.current, services.services[services.current]


def service_for_url(url: str) -> ServiceRecord | None:
    """The recorded service at ``url`` (the first, by name), if any: its pin and token serve a
    ``--url`` that names it."""
    wanted = same_url_key(url)
    for _, record in sorted(load().services.items()):
        if same_url_key(record.url) == wanted:
            return record
    return None


def same_url_key(url: str) -> str:
    """``url`` as compared with recorded ones: no trailing slash, scheme and host in lower
    case."""
    url = url.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}{sep}{host.lower()}{slash}{path}"


def check_service_name(name: str) -> str:
    """``name`` if it can name a service; else InvalidRequestError saying what a name is."""
    check_name(name, "service name")
    if name == LOCAL:
        raise InvalidRequestError(f"{LOCAL!r} is not a service name: `ringtrain login --use "
                                  f"{LOCAL}` means this host's own job service")
    return name


def remember_service(name: str, url: str, fingerprint: str | None, *,
                     token: str | None = None, token_file: Path | None = None) -> ServiceRecord:
    """Record service ``name`` (replacing one of that name) and make it current.

    Args:
        token: the token itself, copied into a private file here; or
        token_file: the file that holds it, read at each use.

    Raises:
        InvalidRequestError: a bad name, or neither (or both) of ``token``/``token_file``.
    """
    check_service_name(name)
    if (token is None) == (token_file is None):
        raise InvalidRequestError("give the service's token either in a file or on stdin")
    with _locked() as services:
        old = services.services.get(name)
        if token is not None:
            path = config_dir() / "tokens" / name
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _write_private(path, token.strip() + "\n")
            record = ServiceRecord(url=url, fingerprint=fingerprint, token_file=str(path),
                                   token_copied=True)
        else:
            assert token_file is not None
            record = ServiceRecord(url=url, fingerprint=fingerprint,
                                   token_file=str(token_file.expanduser().resolve()))
            if old is not None and old.token_copied:  # the copy of an earlier login goes
                Path(old.token_file).unlink(missing_ok=True)
        services.services[name] = record
        services.current = name
    return record


def use_service(name: str) -> ServiceRecord | None:
    """Make service ``name`` current; ``LOCAL``: none (commands use this host's home). Returns
    the record, or ``None`` for ``LOCAL``.

    Raises:
        NotFoundError: no service of that name (the message lists the names).
    """
    with _locked() as services:
        if name == LOCAL:
            services.current = None
            return None
        record = _get(services, name)
        services.current = name
    return record


def forget_service(name: str) -> ServiceRecord:
    """Remove service ``name`` and the token copied for it (not a file the user named); if it
    was current, none is any more.

    Raises:
        NotFoundError: no service of that name.
    """
    with _locked() as services:
        record = _get(services, name)
        del services.services[name]
        if services.current == name:
            services.current = None
        if record.token_copied:
            Path(record.token_file).unlink(missing_ok=True)
    return record


def _get(services: Services, name: str) -> ServiceRecord:
    if name not in services.services:
        known = ", ".join(sorted(services.services)) or "none yet"
        raise NotFoundError(f"no service is called {name!r} (logged in: {known}; "
                            "`ringtrain login URL --name NAME` adds one)")
    return services.services[name]


@contextmanager
def _locked() -> Iterator[Services]:
    """The services, to change in the block; written back at its end, under a lock."""
    folder = config_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(folder / "services.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        services = load()
        yield services
        _write_private(services_file(), services.model_dump_json(indent=2) + "\n")
    finally:
        os.close(fd)  # and with it the lock


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` whole, mode 600 from its creation, and rename it into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)  # a crashed write's leftover keeps its own mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
