"""One shared-memory segment of the ranks of a process set on one host, and its synchronisation.

Layout (every part aligned to a 64-byte cache line)::

    header   magic, member count, slot size
    flags    one line per member: [0] its sequence number, [1] its state (ok / aborted / closed),
             [2] the member it sleeps on, + 1 (0: it does not sleep)
    splits   two n x n int64 tables (alltoall's row counts), one per data buffer
    data     two buffers (so one step's writes never wait for the previous step's readers)
             of n slots of ``slot_bytes`` each; member i alone writes slot i

Each member alone writes its own flag line and only raises its sequence number (``3 * step +
phase``); aligned 8-byte stores are atomic and x86 keeps them in order, so data written before a
number is visible to whoever reads that number. How a waiter spins, yields, then sleeps on a
futex without missing a publish, and how it notices a dead peer: docs/shared_memory.md.
"""

from __future__ import annotations

import errno
import mmap
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ringtrain.backends import futex, spin
from ringtrain.errors import ConfigError, RingtrainError
from ringtrain.proc_stat import is_alive

_MAGIC = 0x52494E47_53484D31  # "RINGSHM1"
_LINE = 64
#: A flag line as int64 words: a member's sequence number, its state, the member it sleeps on + 1.
_LINE_WORDS = _LINE // 8
_SEQ, _SLEEPS_ON = 0, 2
_OK, _ABORTED, _CLOSED = 0, 1, 2
#: A waiter spins first (as long as :func:`spin.spin_s` allows: a peer already in the collective
#: arrives within microseconds), then yields the core (sched_yield) until this long has passed,
#: then sleeps on the futex of the member it waits for, which that member's next publish wakes: a
#: waiter that spun or napped instead would use up its share of a loaded machine's cores and be
#: scheduled late when its peer is done. Measured on 2 loaded cores, a waiter that went to sleep
#: at once made a back-to-back 4 KiB allreduce 5x slower.
_YIELD_S = 2e-4
#: How often a waiting member checks that the members it waits for still live.
_CHECK_S = 0.1


@dataclass(frozen=True)
class Member:
    """A rank of the segment, as its peers check that it still lives."""

    rank: int  # global rank, for messages
    pid: int
    start_ticks: int  # -1: unknown (only the pid is checked)


class SharedMemoryError(RingtrainError, RuntimeError):
    """A shared-memory collective could not complete: a member died or gave up (the engine
    reports it as the ``HorovodInternalError`` of a failed collective)."""


class SharedMemorySpaceError(ConfigError):
    """``/dev/shm`` cannot hold the segments this job needs."""


def segment_bytes(members: int, slot_bytes: int) -> int:
    """The size of a segment for ``members`` ranks with slots of ``slot_bytes``."""
    return _data_offset(members) + 2 * members * slot_bytes


def _splits_offset(n: int) -> int:
    return _LINE + n * _LINE


def _data_offset(n: int) -> int:
    return align(_splits_offset(n) + 2 * n * n * 8)


def align(nbytes: int) -> int:
    """``nbytes`` rounded up to whole 64-byte cache lines."""
    return (nbytes + _LINE - 1) // _LINE * _LINE


class Segment:
    """A mapped segment, as member ``me`` of ``members`` sees it.

    Create it with :meth:`create` (the lowest member) and :meth:`attach` (the others).
    """

    def __init__(self, path: Path, buf: mmap.mmap, members: Sequence[Member], me: int,
                 slot_bytes: int, timeout_s: float):
        self.path = path
        self.members = tuple(members)
        self.n = len(members)
        self.me = me
        self.slot_bytes = slot_bytes
        # What one step of a collective carries per member: the whole slot unless set lower
        # (see ShmGroup.choose_step); every member must use the same.
        self.step_bytes = slot_bytes
        self._timeout_s = timeout_s
        self._mmap = buf
        n = self.n
        self._header = np.ndarray((3,), np.int64, buffer=buf, offset=0)
        lines = np.ndarray((n, _LINE // 8), np.int64, buffer=buf, offset=_LINE)
        self._seq = lines[:, 0]
        # The same numbers as Python ints, without numpy's per-call cost (a small collective's
        # own Python is its cost): member j's line starts at word _LINE_WORDS * j.
        self._words = memoryview(buf)[_LINE:_LINE + n * _LINE].cast("q")
        self._lines = range(0, n * _LINE_WORDS, _LINE_WORDS)
        self._my_line = _LINE_WORDS * me
        # The low 32 bits of each member's sequence number: the futex its publishes wake.
        low = 0 if sys.byteorder == "little" else 4
        base = lines.__array_interface__["data"][0]
        self._seq_addresses = [base + j * _LINE + low for j in range(n)]
        self._state = lines[:, 1]
        self.splits = np.ndarray((2, n, n), np.int64, buffer=buf, offset=_splits_offset(n))
        self._data = torch.frombuffer(buf, dtype=torch.uint8, offset=_data_offset(n),
                                      count=2 * n * slot_bytes)
        # Per dtype: both buffers' slots as flat tensors, and a slot's element count (made once:
        # a small collective's own Python is its cost).
        self._typed: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._elements: dict[torch.dtype, int] = {}
        self.step = int(self._seq[me]) // 3  # the next step (0 in a fresh segment)
        self.fd: int | None = None  # an open descriptor of the file, when asked to keep one

    # -- setting up -----------------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path, members: Sequence[Member], slot_bytes: int,
               timeout_s: float, keep_fd: bool = False) -> Segment:
        """Create and map the segment file as its first member (index 0).

        The file appears under its name only complete (written under a temporary name, then
        renamed), so a member that finds it may map it at once. ``keep_fd``: keep a descriptor
        of the file open as :attr:`fd` (for ``flock``) until :meth:`close`.

        Raises:
            SharedMemorySpaceError: the file system cannot hold it (names the size and the
                switch that turns shared memory off).
        """
        size = segment_bytes(len(members), slot_bytes)
        check_space(path.parent, size)
        tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)  # reserve every page now: no SIGBUS later
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise _space_error(path.parent, size) from None
                raise
            buf = mmap.mmap(fd, size)
            header = np.ndarray((3,), np.int64, buffer=buf, offset=0)
            header[:] = (_MAGIC, len(members), slot_bytes)
            del header  # (a live view would keep the mapping from closing)
            os.rename(tmp, path)
            kept = os.dup(fd) if keep_fd else None
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        segment = cls(path, buf, members, 0, slot_bytes, timeout_s)
        segment.fd = kept
        return segment

    @classmethod
    def attach(cls, path: Path, members: Sequence[Member], me: int, slot_bytes: int,
               timeout_s: float, setup_timeout_s: float, keep_fd: bool = False) -> Segment:
        """Map the segment member 0 creates, waiting for it to appear (``keep_fd``: as for
        :meth:`create`).

        Raises:
            SharedMemoryError: member 0 died or did not create it within ``setup_timeout_s``.
        """
        deadline = time.monotonic() + setup_timeout_s
        nap = 1e-4
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
                break
            except FileNotFoundError:
                pass
            creator = members[0]
            if not is_alive(creator.pid, None if creator.start_ticks < 0 else creator.start_ticks):
                raise SharedMemoryError(f"rank {creator.rank} died before creating the shared "
                                        f"memory segment {path}")
            if time.monotonic() > deadline:
                raise SharedMemoryError(
                    f"rank {creator.rank} did not create the shared-memory segment {path} within "
                    f"{setup_timeout_s:g} s; is /dev/shm the same file system for every rank of "
                    "this host? (RINGTRAIN_SHM=0 turns shared memory off)")
            time.sleep(nap)
            nap = min(nap * 2, 0.01)
        try:
            size = segment_bytes(len(members), slot_bytes)
            if os.fstat(fd).st_size != size:
                raise SharedMemoryError(f"shared-memory segment {path} has the wrong size "
                                        "(another job's file under this job's name?)")
            buf = mmap.mmap(fd, size)
            kept = os.dup(fd) if keep_fd else None
        finally:
            os.close(fd)
        segment = cls(path, buf, members, me, slot_bytes, timeout_s)
        if tuple(segment._header) != (_MAGIC, len(members), slot_bytes):
            if kept is not None:
                os.close(kept)
            raise SharedMemoryError(f"shared-memory segment {path} has a foreign header")
        segment.fd = kept
        return segment

    def mark_attached(self) -> None:
        """Tell the others this member has mapped the segment: it has done step 0."""
        self.publish(0, 3)
        self.step = 1

    def wait_attached(self) -> None:
        """Wait until every member has mapped the segment (then it may be unlinked)."""
        self.wait_all(3, "set-up")

    def unlink(self) -> None:
        """Remove the file; the mappings stay valid until each member closes its own."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def abort(self) -> None:
        """Say this member gave up in the middle of a collective: peers waiting for it fail."""
        if not self._mmap.closed:
            self._state[self.me] = _ABORTED
            futex.wake(self._seq_addresses[self.me])  # waiters see the state at once

    def close(self, aborted: bool = False) -> None:
        """Say this member is gone (a peer still waiting for it fails at once) and unmap."""
        if self._mmap.closed:
            return
        self._state[self.me] = _ABORTED if aborted else _CLOSED
        futex.wake(self._seq_addresses[self.me])
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._typed.clear()
        self._words.release()
        del self._data, self._seq, self._state, self.splits, self._header, self._words
        try:
            self._mmap.close()
        except BufferError:  # a tensor view is still alive somewhere: leave it to the GC
            pass

    # -- data ------------------------------------------------------------------------------------

    def slots(self, dtype: torch.dtype, buffer: int) -> list[torch.Tensor]:
        """Every member's slot of ``buffer`` (0 or 1) as flat tensors of ``dtype`` (a list kept
        for the next call: read it, do not change it)."""
        typed = self._typed.get(dtype)
        if typed is None:
            both = self._data.view(dtype).view(2, self.n, -1)
            typed = self._typed[dtype] = (list(both[0]), list(both[1]))
        return typed[buffer]

    def data_bytes(self) -> np.ndarray:
        """The whole data area (both buffers) as bytes, for a segment that holds something
        other than collectives' slots (the doorbell's). Delete the view before :meth:`close`."""
        return np.ndarray((2 * self.n * self.slot_bytes,), np.uint8, buffer=self._mmap,
                          offset=_data_offset(self.n))

    def step_elements(self, dtype: torch.dtype) -> int:
        """How many elements of ``dtype`` one step carries per member."""
        count = self._elements.get(dtype)
        if count is None:
            count = self._elements[dtype] = (
                self.step_bytes // torch.empty((), dtype=dtype).element_size())
        return count

    def set_step_bytes(self, step_bytes: int) -> None:
        """Carry ``step_bytes`` per member per step from now on (at most the slot; every
        member must set the same before its next collective)."""
        if not 0 < step_bytes <= self.slot_bytes:
            raise ValueError(f"a step of {step_bytes} bytes does not fit slots of "
                             f"{self.slot_bytes}")
        self.step_bytes = step_bytes
        self._elements.clear()

    # -- synchronisation -------------------------------------------------------------------------

    def publish(self, step: int, phase: int) -> None:
        """This member finished ``phase`` (1..3) of ``step``; wake the members waiting for it."""
        words = self._words
        words[self._my_line + _SEQ] = 3 * step + phase
        sleeper = self.me + 1
        for line in self._lines:
            if words[line + _SLEEPS_ON] == sleeper:
                futex.wake(self._seq_addresses[self.me])
                return

    def begin(self, what: str) -> tuple[int, int]:
        """Start the next step: wait until every member is done reading the buffer it will
        write (two steps ago). Returns ``(step, buffer)``."""
        step = self.step
        self.step += 1
        self.wait_all(3 * (step - 1), what)
        return step, step % 2

    def wait_all(self, target: int, what: str) -> None:
        """Wait until every member's sequence number reaches ``target``."""
        words, lines = self._words, self._lines
        for line in lines:  # most often every member is there: no closure made for the wait
            if words[line + _SEQ] < target:
                break
        else:
            return

        def ready() -> bool:
            for line in lines:
                if words[line + _SEQ] < target:
                    return False
            return True

        self._wait(ready, range(self.n), target, what)

    def wait_one(self, member: int, target: int, what: str) -> None:
        """Wait until member ``member``'s sequence number reaches ``target``."""
        words, seq = self._words, _LINE_WORDS * member + _SEQ
        if words[seq] >= target:
            return
        self._wait(lambda: words[seq] >= target, (member,), target, what)

    def _wait(self, ready, among: Sequence[int], target: int, what: str) -> None:
        start = last_check = time.monotonic()
        spin_s = spin.spin_s()
        while (waited := time.monotonic() - start) < _YIELD_S:
            if ready():
                return
            if waited >= spin_s:
                os.sched_yield()
        while True:
            # Sleep on the first late member's number: its next publish wakes this waiter.
            words = self._words
            late = next((j for j in among if words[_LINE_WORDS * j + _SEQ] < target), None)
            if late is None:
                return
            words[self._my_line + _SLEEPS_ON] = late + 1  # before reading: see shared_memory.md
            try:
                seen = words[_LINE_WORDS * late + _SEQ] & 0xFFFFFFFF
                if ready():
                    return
                now = time.monotonic()
                futex.wait(self._seq_addresses[late], seen,
                           max(last_check + _CHECK_S - now, 1e-4))
            finally:
                words[self._my_line + _SLEEPS_ON] = 0
            if ready():
                return
            now = time.monotonic()
            if now - last_check >= _CHECK_S:
                last_check = now
                self._check_members(ready, among, target, what, now - start)

    def _check_members(self, ready, among: Sequence[int], target: int, what: str,
                       waited: float) -> None:
        late = [j for j in among if self._seq[j] < target]
        for j in late:
            member = self.members[j]
            state = int(self._state[j])
            if state != _OK or not is_alive(member.pid, None if member.start_ticks < 0
                                            else member.start_ticks):
                if ready():  # it finished its part before it went
                    return
                if state == _CLOSED:
                    cause = "shut down"
                elif state == _ABORTED:
                    cause = "gave up (its own collective failed)"
                else:
                    cause = "died (its process is gone: it exited or was killed)"
                raise SharedMemoryError(
                    f"rank {member.rank} (pid {member.pid}) {cause} during a shared-memory "
                    f"{what} on rank {self.members[self.me].rank}")
        if waited > self._timeout_s:
            ranks = [self.members[j].rank for j in late]
            raise SharedMemoryError(
                f"rank(s) {ranks} did not reach the shared-memory {what} within "
                f"{self._timeout_s:g} s (rank {self.members[self.me].rank} waited)")


#: A data segment's slots (both buffers, every member) take at most this much of ``/dev/shm``,
#: and at most a quarter of what is free there.
SEGMENT_BUDGET_BYTES = 64 << 20
#: Slots are a power of two between these sizes. Which step suits a host depends on its caches,
#: so each segment times both (ShmGroup.choose_step; why: docs/shared_memory.md).
MIN_SLOT_BYTES = 1 << 20
MAX_SLOT_BYTES = 16 << 20


def choose_slot_bytes(members: int, free_bytes: int) -> int:
    """The slot size of a data segment of ``members`` ranks, with ``free_bytes`` free in
    ``/dev/shm`` (every member must pass the same numbers)."""
    budget = min(SEGMENT_BUDGET_BYTES, free_bytes // 4)
    slot = MAX_SLOT_BYTES
    while slot > MIN_SLOT_BYTES and 2 * members * slot > budget:
        slot //= 2
    return slot


def free_bytes(directory: Path) -> int:
    """Bytes free in ``directory`` (0 when it cannot be read: :func:`check_space` says why)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def check_space(directory: Path, size: int) -> None:
    """Fail unless ``directory`` has ``size`` bytes free.

    Raises:
        SharedMemorySpaceError: it has not (names the size and the switch to turn shared
            memory off).
    """
    try:
        st = os.statvfs(directory)
    except OSError as exc:
        raise SharedMemorySpaceError(
            f"cannot use {directory} for shared memory ({exc.strerror}); set RINGTRAIN_SHM=0 "
            "(or `ringtrain run --no-shm`) to use Gloo over loopback instead") from None
    if st.f_bavail * st.f_frsize < size:
        raise _space_error(directory, size, st.f_bavail * st.f_frsize)


def _space_error(directory: Path, size: int, free: int | None = None) -> SharedMemorySpaceError:
    have = "" if free is None else f" ({free / 2**20:.1f} MiB free)"
    return SharedMemorySpaceError(
        f"{directory} is too small for ringtrain's shared-memory segment: it needs "
        f"{size / 2**20:.1f} MiB{have}; enlarge it (docker run --shm-size=1g, or "
        f"mount -o remount,size=... {directory}), or set RINGTRAIN_SHM=0 (`ringtrain run "
        "--no-shm`) to use Gloo over loopback instead")
