"""What of a job's ``working_dir`` is copied into the job: the folder less what it ignores.

Skipped, at any depth: what ``.gitignore`` and ``.ringtrainignore`` files say (git's pattern
syntax; each file rules over its own folder and everything below it, as git reads them), the
names of :data:`ALWAYS_SKIPPED` (version control, environments, caches) and any ringtrain home
(a folder holding a job database or a server's token: ``RINGTRAIN_HOME`` inside the project
must never travel into a job, its token least of all).

The CLI sizes the copy with :func:`plan_copy` before it submits (it shows the size, warns above
:data:`WARN_BYTES` and refuses above a limit); the service copies with :class:`CopyFilter`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

IGNORE_FILES = (".gitignore", ".ringtrainignore")
ALWAYS_SKIPPED = (".git", ".hg", ".venv", "venv", "__pycache__", ".pytest_cache", "*.pyc",
                  ".ringtrain", "node_modules", ".mypy_cache")
#: Above this, ``job submit`` warns that the copy is large.
WARN_BYTES = 100 << 20
#: ``job submit`` refuses a working dir larger than this unless given a higher limit.
DEFAULT_MAX_BYTES = 2 << 30
_HOME_MARKERS = ("jobs.sqlite", "server.json", "server.lock")


def is_ringtrain_home(folder: Path) -> bool:
    """Whether ``folder`` is a ringtrain home (a job service's database, token or server)."""
    return any((folder / name).exists() for name in _HOME_MARKERS)


class CopyFilter:
    """Decides, folder by folder, which entries of a working dir are skipped.

    Use as ``shutil.copytree(src, dst, ignore=CopyFilter(src))``: copytree calls it top-down,
    so each folder's ignore files are read before its entries are decided.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._always = pathspec.GitIgnoreSpec.from_lines(ALWAYS_SKIPPED)
        self._specs: dict[Path, pathspec.GitIgnoreSpec] = {}  # folder -> its ignore files' rules

    def _spec_of(self, folder: Path) -> pathspec.GitIgnoreSpec | None:
        if folder not in self._specs:
            lines: list[str] = []
            for name in IGNORE_FILES:
                try:
                    lines += (folder / name).read_text(errors="replace").splitlines()
                except OSError:
                    pass
            self._specs[folder] = pathspec.GitIgnoreSpec.from_lines(lines)
        return self._specs[folder] or None

    def skipped(self, folder: Path, name: str) -> bool:
        """Whether ``folder/name`` is left out of the copy."""
        path = folder / name
        is_dir = path.is_dir() and not path.is_symlink()
        rel_name = name + "/" if is_dir else name
        if self._always.match_file(rel_name):
            return True
        if is_dir and is_ringtrain_home(path):
            return True
        for ancestor in (folder, *folder.parents):
            spec = self._spec_of(ancestor)
            if spec is not None:
                rel = path.relative_to(ancestor).as_posix() + ("/" if is_dir else "")
                if spec.match_file(rel):
                    return True
            if ancestor == self.root:
                break
        return False

    def __call__(self, folder: str, names: list[str]) -> set[str]:
        here = Path(folder)
        return {name for name in names if self.skipped(here, name)}


@dataclass
class CopyPlan:
    """What a copy of a working dir would hold."""

    files: int = 0
    bytes: int = 0
    #: Skipped entries (relative paths, folders with a trailing ``/``), in walk order.
    skipped: list[str] = field(default_factory=list)


def plan_copy(root: Path) -> CopyPlan:
    """Walk ``root`` as the copy would, counting files and bytes (symbolic links count as
    links, not followed). Raises OSError if ``root`` cannot be read."""
    root = Path(root)
    keep = CopyFilter(root)
    plan = CopyPlan()
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        for names in (dirs, files):
            gone = keep(folder, names)
            plan.skipped += [(here / n).relative_to(root).as_posix()
                             + ("/" if names is dirs else "") for n in sorted(gone)]
            names[:] = [n for n in names if n not in gone]
        for name in files:
            plan.files += 1
            try:
                plan.bytes += os.lstat(here / name).st_size
            except OSError:
                pass
    return plan


def human_bytes(n: int) -> str:
    """``n`` bytes as ``1.2 MB`` (powers of 1000, as ``du --si``)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
