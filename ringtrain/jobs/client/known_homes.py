"""The homes this user has run a job service for, so that a command can point at the others.

A user with two homes (``RINGTRAIN_HOME`` set in one shell, the default in another) sees another
home's clusters and jobs vanish, and a command that starts a server in an empty home would say
nothing of it. Each server start records its home here, one small file per home under
``$XDG_CACHE_HOME/ringtrain/homes`` (default ``~/.cache``), written whole so that concurrent
starts never mix their lines; :func:`other_running_homes` reads them back and keeps the homes
whose recorded server process still lives. The records are hints: the record of a home that no
longer exists (a test's temporary home, say) is dropped, and nothing here is ever an error.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ringtrain.jobs.errors import RecordError
from ringtrain.jobs.home import Home
from ringtrain.jobs.server_info import ServerInfo
from ringtrain.proc_stat import is_alive

#: How many recorded homes are read at most, the most recently started first: the folder is the
#: user's own, but a command must not slow down on a folder that grew without bound.
MAX_HOMES = 256


def registry_dir() -> Path:
    """The folder of the records (created by :func:`remember`)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "ringtrain" / "homes"


def remember(home: Home) -> None:
    """Record that a job service runs for ``home`` (best effort: a read-only cache is no error)."""
    root = str(home.root)
    folder = registry_dir()
    record = folder / hashlib.sha256(root.encode()).hexdigest()[:16]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{record.name}.{os.getpid()}.tmp"
        tmp.write_text(root)
        tmp.replace(record)  # a new modification time: the most recent start reads first
    except OSError:
        pass


def other_running_homes(home: Home) -> list[Path]:
    """The recorded homes, other than ``home``, whose server process is alive, sorted."""
    try:
        records = sorted(registry_dir().iterdir(), key=_started, reverse=True)[:MAX_HOMES]
    except OSError:
        return []
    found = set()
    for record in records:
        try:
            root = Path(record.read_text(errors="replace")[:4096])
            if not root.is_dir():
                record.unlink()
                continue
            info = ServerInfo.read(Home(root).server_file)
        except (OSError, RecordError):
            continue
        if root != home.root and info is not None and is_alive(info.pid, None):
            found.add(root)
    return sorted(found)


def _started(record: Path) -> float:
    try:
        return record.stat().st_mtime
    except OSError:
        return 0.0


def elsewhere_hint(home: Home) -> str:
    """A sentence naming the other homes with a running server (empty when there are none)."""
    others = other_running_homes(home)
    if not others:
        return ""
    names = ", ".join(str(p) for p in others[:5]) + (" and more" if len(others) > 5 else "")
    return (f"job services run for other homes: {names} (set RINGTRAIN_HOME={others[0]} to "
            "use that one)")
