"""Uploads of a remote ``job submit``: its working dir and inputs as one tar, resumable.

An upload is named by the submit's idempotency key and kept under ``<share>/uploads/<key>/``
(``data.tar`` as received, ``meta.json``: its owner and manifest). ``PUT /v1/uploads/{key}
?offset=N`` appends a body at byte N (0 starts over), checked as it arrives
(:class:`~ringtrain.jobs.files.upload_tar.TarChecker`); ``GET`` says how many bytes came, so a
client that lost its connection, or was killed, sends only the rest. The submit that names the
upload extracts it into the job's folder while staging, and then it is removed; one never
submitted is removed after :data:`TTL_S`.

An upload belongs to the token that started it (the admin's, or a scoped one's id): another
caller gets 404, as for an unknown key. Each owner has at most :data:`MAX_PER_OWNER` uploads,
the service :data:`MAX_UPLOADS`, each at most the working dir limit.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ringtrain.jobs.errors import (
    BusyError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    SpecError,
)
from ringtrain.jobs.files.upload_tar import (
    INPUTS,
    UPLOAD_SCHEME,
    WORKING_DIR,
    TarChecker,
    UploadRejected,
    extract,
)
from ringtrain.jobs.files.workdir import DEFAULT_MAX_BYTES
from ringtrain.jobs.models import JobSpec

TTL_S = 24 * 3600
MAX_PER_OWNER = 8
MAX_UPLOADS = 64


@dataclass(frozen=True)
class UploadStatus:
    received: int
    manifest: str
    complete: bool


class _Open:
    """An upload being written by one request."""

    def __init__(self, folder: Path, checker: TarChecker):
        self.folder = folder
        self.checker = checker
        self.file = open(folder / "data.tar", "r+b")  # noqa: SIM115 (closed by Uploads.close)
        self.file.seek(checker.received)
        self.file.truncate()


class Uploads:
    """The uploads under ``root``.

    Args:
        max_file_bytes: the most bytes the files of one upload may hold.
        clock: seconds since the epoch (injectable).
    """

    def __init__(self, root: Path, max_file_bytes: int = DEFAULT_MAX_BYTES,
                 clock: Callable[[], float] = time.time):
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._checkers: dict[str, TarChecker] = {}  # key -> the check of what came so far
        self._writing: set[str] = set()

    def _folder(self, key: str) -> Path:
        return self.root / key

    def _meta(self, key: str, owner: str) -> dict[str, str | float]:
        """The upload's record, if ``owner``'s.

        Raises:
            NotFoundError: none, or another caller's.
        """
        try:
            meta = json.loads((self._folder(key) / "meta.json").read_text())
        except (OSError, ValueError):
            meta = None
        if not isinstance(meta, dict) or meta.get("owner") != owner:
            raise NotFoundError(f"no upload {key!r} of this token")
        return meta

    def _checker(self, key: str) -> TarChecker:
        """What came of ``key``, checked (read again from disk after a restart)."""
        checker = self._checkers.get(key)
        if checker is None:
            checker = TarChecker(self.max_file_bytes)
            try:
                with open(self._folder(key) / "data.tar", "rb") as f:
                    while data := f.read(1 << 20):
                        checker.feed(data)
            except (OSError, UploadRejected):
                checker = TarChecker(self.max_file_bytes)
            self._checkers[key] = checker
        return checker

    def status(self, key: str, owner: str) -> UploadStatus:
        """How much of ``owner``'s upload ``key`` came. Raises NotFoundError."""
        with self._lock:
            meta = self._meta(key, owner)
            checker = self._checker(key)
            return UploadStatus(checker.received, str(meta["manifest"]), checker.complete)

    def open(self, key: str, owner: str, offset: int, manifest: str) -> _Open:
        """Start writing ``key`` at ``offset`` (0: anew; else what ``status`` said).

        Raises:
            ConflictError: ``offset`` is not the bytes received, or another manifest.
            BusyError: another request writes it (a killed client's, not yet ended here).
            InvalidRequestError: the caller, or the service, holds too many uploads.
        """
        with self._lock:
            if key in self._writing:
                raise BusyError(f"upload {key!r} is being written by another request (a client "
                                "that was stopped: it ends within seconds)", 1)
            folder = self._folder(key)
            if offset == 0:
                if folder.exists():
                    self._meta(key, owner)  # another's: 404
                else:
                    self._make_room(owner)
                shutil.rmtree(folder, ignore_errors=True)
                self._checkers.pop(key, None)
                folder.mkdir(parents=True)
                (folder / "data.tar").touch()
                (folder / "meta.json").write_text(json.dumps(
                    {"owner": owner, "manifest": manifest, "created_at": self.clock()}))
            meta = self._meta(key, owner)
            checker = self._checker(key)
            if offset != checker.received or meta["manifest"] != manifest:
                raise ConflictError(f"upload {key!r} has {checker.received} bytes of manifest "
                                    f"{meta['manifest']}; send from there, or from 0")
            self._writing.add(key)
            return _Open(folder, checker)

    def write(self, upload: _Open, data: bytes) -> None:
        """Append ``data``, checked first. Raises UploadRejected (the upload is then gone)."""
        try:
            upload.checker.feed(data)
        except UploadRejected:
            self.close(upload)
            self.remove(upload.folder.name)
            raise
        upload.file.write(data)

    def close(self, upload: _Open) -> UploadStatus:
        """The request ended (whole or cut): what is written stays for a resume."""
        with self._lock:
            if not upload.file.closed:
                upload.file.close()
            try:
                size = os.path.getsize(upload.folder / "data.tar")
            except OSError:  # refused, and removed
                size = -1
            # What a cut write left unchecked must not be counted: read it again next time.
            if size != upload.checker.received:
                self._checkers.pop(upload.folder.name, None)
            self._writing.discard(upload.folder.name)
            return UploadStatus(upload.checker.received, "", upload.checker.complete)

    def require_complete(self, key: str, owner: str) -> None:
        """Raises NotFoundError (none of the caller's) or InvalidRequestError (not whole)."""
        status = self.status(key, owner)
        if not status.complete:
            raise InvalidRequestError(f"upload {key!r} is not complete ({status.received} bytes "
                                      "came): send the rest first")

    def extract_into(self, key: str, dest: Path) -> None:
        """Write the upload's files into the new folder ``dest`` (while staging)."""
        extract(self._folder(key) / "data.tar", dest, self.max_file_bytes)

    def remove(self, key: str) -> None:
        with self._lock:
            self._checkers.pop(key, None)
            shutil.rmtree(self._folder(key), ignore_errors=True)

    def _make_room(self, owner: str) -> None:
        """Drop expired uploads; refuse a new one over the caps."""
        now = self.clock()
        mine = total = 0
        for folder in sorted(self.root.glob("*")) if self.root.exists() else []:
            try:
                meta = json.loads((folder / "meta.json").read_text())
                expired = now - float(meta["created_at"]) > TTL_S
            except (OSError, ValueError, KeyError, TypeError):
                meta, expired = {}, True
            if expired and folder.name not in self._writing:
                self._checkers.pop(folder.name, None)
                shutil.rmtree(folder, ignore_errors=True)
                continue
            total += 1
            mine += meta.get("owner") == owner
        if mine >= MAX_PER_OWNER or total >= MAX_UPLOADS:
            raise InvalidRequestError(
                f"too many uploads not yet submitted ({mine} of this token, {total} in all; at "
                f"most {MAX_PER_OWNER} and {MAX_UPLOADS}); they are removed 24 h after they start")


def uploaded_key(working_dir: str | None) -> str | None:
    """The upload a working dir names (``upload://wd`` as sent: ``""``; ``upload://KEY`` as
    recorded: KEY), or ``None`` for a path."""
    if working_dir is None or not working_dir.startswith(UPLOAD_SCHEME):
        return None
    rest = working_dir[len(UPLOAD_SCHEME):]
    return "" if rest == WORKING_DIR else rest


def checkable(spec: JobSpec) -> JobSpec:
    """``spec`` as sent, less its uploaded parts (what the host's checks apply to).

    Raises:
        SpecError: an ``upload://`` value other than ``upload://wd`` or ``upload://inputs/NAME``.
    """
    errors = []
    if spec.working_dir != UPLOAD_SCHEME + WORKING_DIR:
        errors.append({"field": "working_dir", "message": f"{UPLOAD_SCHEME}{WORKING_DIR} names "
                                                          "the uploaded working dir"})
    inputs = {}
    for name, value in spec.inputs.items():
        if isinstance(value, str) and value.startswith(UPLOAD_SCHEME):
            if value != f"{UPLOAD_SCHEME}{INPUTS}/{name}":
                errors.append({"field": f"inputs.{name}",
                               "message": f"an uploaded input is {UPLOAD_SCHEME}{INPUTS}/{name}"})
            continue
        inputs[name] = value
    if errors:
        raise SpecError(errors)
    return spec.model_copy(update={"working_dir": None, "inputs": inputs})


def recorded_spec(spec: JobSpec, key: str, job_dir: Path) -> JobSpec:
    """``spec`` as the job records it: the working dir ``upload://KEY``, each uploaded input
    its path in the job's folder."""
    inputs = {name: (str(job_dir / INPUTS / name) if isinstance(value, str)
                     and value.startswith(UPLOAD_SCHEME) else value)
              for name, value in spec.inputs.items()}
    return spec.model_copy(update={"working_dir": UPLOAD_SCHEME + key, "inputs": inputs})
