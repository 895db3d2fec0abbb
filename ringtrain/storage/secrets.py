"""Named secrets: a store's credentials kept by the service, referenced from specs by name.

A secret is a mapping of the store library's options (``key``/``secret`` for S3,
``connection_string``, ``account_key`` or ``sas_token`` for Azure, ``token`` for Google). Each
is one JSON file of mode 600 in a folder of mode 700; the service reads them when a job stages
or uploads and hands them to the stager through a private file, never through the spec, the job
record or a log. Values never leave this module except to open a store.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: A secret holds at most this many options, each at most this long (a Google key file is ~2 KB).
MAX_OPTIONS = 32
MAX_VALUE = 16 * 1024


class SecretError(ValueError):
    """A secret that is malformed or does not exist; the message never holds a value."""


def check_options(options: object) -> dict[str, str]:
    """``options`` as a secret's mapping of option names to string values, or SecretError."""
    if not isinstance(options, dict) or not options:
        raise SecretError("a secret is a non-empty mapping of option names to values, e.g. "
                          "{\"key\": \"...\", \"secret\": \"...\"} for S3")
    if len(options) > MAX_OPTIONS:
        raise SecretError(f"a secret holds at most {MAX_OPTIONS} options (got {len(options)})")
    for name, value in options.items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
            raise SecretError(f"option names are identifiers (got {str(name)[:64]!r})")
        if not isinstance(value, str) or len(value) > MAX_VALUE:
            raise SecretError(f"option {name}: a string of at most {MAX_VALUE} characters")
    return dict(options)


class SecretStore:
    """The secrets of one service home, in ``folder``."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, name: str) -> Path:
        if not NAME_RULE.match(name):
            raise SecretError(f"secret names are 1-64 letters, digits, '.', '_' or '-' "
                              f"(got {name[:64]!r})")
        return self.folder / f"{name}.json"

    def set(self, name: str, options: object) -> None:
        """Create or replace the secret ``name`` (atomically, mode 600 from the start)."""
        path = self._path(name)
        data = json.dumps(check_options(options)).encode()
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def get(self, name: str) -> dict[str, str]:
        """The options of secret ``name``; SecretError naming it if there is none."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise SecretError(f"no secret named {name!r}; create it with "
                              f"`ringtrain secret set {name}`") from None
        with os.fdopen(fd, "rb") as f:
            try:
                return check_options(json.loads(f.read(MAX_OPTIONS * MAX_VALUE * 2)))
            except (ValueError, SecretError):
                raise SecretError(f"secret {name!r} is unreadable; set it again") from None

    def names(self) -> list[str]:
        """The names of the secrets, sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if NAME_RULE.match(p.stem))

    def delete(self, name: str) -> bool:
        """Remove secret ``name``; False if there was none."""
        try:
            self._path(name).unlink()
        except FileNotFoundError:
            return False
        return True
