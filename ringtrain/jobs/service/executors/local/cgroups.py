"""A cgroup v2 per attempt: the one mark of a job's processes that no process of it can shed.

A process can leave its process group and session (``setsid``) and drop the job's environment
variable (``env -u``), but it cannot leave its cgroup without write access to the hierarchy. So
where this process may create cgroups below its own (root, or a delegated subtree), each attempt
gets one, its job runner moves itself in before starting anything, every descendant is born in
it, and the attempt's end kills the whole cgroup (``cgroup.kill``, or each member where the
kernel lacks it) and removes it.

Standard library only: the job runner uses :func:`join` and :func:`leave_and_remove`.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

_PREFIX = "ringtrain-"


class JobCgroups:
    """Creates the attempt cgroups of one share below one parent cgroup (the service's own);
    ``tag`` keeps the names of different shares apart (their services may share a parent)."""

    def __init__(self, parent: Path, tag: str):
        self.parent = parent
        self.tag = tag

    @classmethod
    def detect(cls, share_root: Path) -> JobCgroups | None:
        """The attempt cgroups of the jobs of ``share_root``, below this process's own cgroup
        v2; ``None`` where it may not create any (no cgroup v2 mount, a read-only hierarchy,
        no delegation to this user)."""
        tag = hashlib.sha1(str(share_root).encode()).hexdigest()[:8]
        parent = own_cgroup()
        if parent is None:
            return None
        probe = parent / f"{_PREFIX}probe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            probe.mkdir()
        except OSError:
            return None
        try:
            writable = os.access(probe / "cgroup.procs", os.W_OK)
        finally:
            probe.rmdir()
        return cls(parent, tag) if writable else None

    def create(self, name: str) -> Path:
        """A new, empty cgroup for one attempt (a leftover of the same name is emptied first).
        Raises OSError if it cannot be created."""
        path = self.parent / f"{_PREFIX}{self.tag}-{name}"
        if path.exists():
            kill(path)
            remove(path)
        path.mkdir()
        return path

    def sweep(self) -> int:
        """Kill and remove every attempt cgroup of this share (what attempts whose job runner
        was killed left behind, once no server will release them); how many there were."""
        found = list(self.parent.glob(f"{_PREFIX}{self.tag}-*"))
        for path in found:
            kill(path)
            remove(path)
        return len(found)


def own_cgroup() -> Path | None:
    """The folder of this process's cgroup v2, or ``None`` without a cgroup v2 mount."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    own = next((line[3:] for line in lines if line.startswith("0::")), None)
    # mountinfo: id parent major:minor root mount-point options... - fstype source options
    mount = next((line.split()[4] for line in mounts
                  if " - cgroup2 " in line and line.split()[3] == "/"), None)
    if own is None or mount is None:
        return None
    return Path(mount) / own.lstrip("/")


def join(cgroup: Path) -> None:
    """Move the calling process into ``cgroup``; its children are born there. Raises OSError
    if the move was refused."""
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def leave_and_remove(cgroup: Path) -> None:
    """Kill every other process in ``cgroup``, move the calling process to the parent cgroup
    and remove ``cgroup`` (the job runner's last act). Raises OSError if the move was
    refused."""
    me = os.getpid()
    for pid in pids(cgroup):
        if pid != me:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    join(cgroup.parent)
    remove(cgroup)


def pids(cgroup: Path) -> list[int]:
    """The processes in ``cgroup`` (none once it is gone)."""
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def kill(cgroup: Path) -> int:
    """SIGKILL every process in ``cgroup``, those forked meanwhile included; how many it held."""
    held = pids(cgroup)
    if not held:
        return 0
    try:
        (cgroup / "cgroup.kill").write_text("1")  # Linux 5.14+: the kernel races no fork
        return len(held)
    except FileNotFoundError:
        if not cgroup.exists():
            return 0
    # An older kernel: kill the members until none is left (a fork may add one meanwhile).
    deadline = time.monotonic() + 5
    while (left := pids(cgroup)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    return len(held)


def remove(cgroup: Path, timeout_s: float = 5.0) -> None:
    """Remove ``cgroup`` once its killed processes are gone, waiting up to ``timeout_s`` (a
    process stuck in the kernel can keep it a while: then a warning is logged)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                log.warning("cannot remove the cgroup %s: %s", cgroup, e.strerror)
                return
        time.sleep(0.01)
