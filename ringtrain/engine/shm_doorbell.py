"""The doorbell and the readiness counters in shared memory, for a world on one host.

The contract of :class:`~ringtrain.engine.doorbell.StoreDoorbell` without a round trip to the
launcher's TCP store; how and why it works (the lock, lock-free reads, sleepers, claims):
docs/shared_memory.md, "The control plane". Layout of the segment's data area::

    header    [0] the engines' ring word (32 bits, a futex: bumped by every ring)
              [1] the lock's holder (rank + 1; 0 when free), [2] counters in use
              [3] the callers' ring word (32 bits, a futex: bumped by every ring)
    progress  one int64 per rank: the round its engine waits for (rounds before it are done)
    claims    two int64 per rank: the round + 1 its caller runs itself (0: none), and a digest
              of the unit's counter key it runs it for
    sleepers  two int64 per rank: 1 while its caller, and while its engine, sleeps on its word
    bells     _ROUNDS entries of (round + 1, length, bytes): round r lives in entry r % _ROUNDS
    counters  _COUNTERS entries of (16-byte key digest, value), open addressing

Every change to the tables takes the lock (a ``threading.Lock``, then ``flock`` on the segment's
file). Counter keys are never removed, so whether a key lives here or in the fallback doorbell
(once the table is three-quarters full) is the same on every rank. A claim is written without the
lock (a ring that misses it only wakes the engines) and left in place once its round ran (a claim
of a past round matches no ring).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import platform
import threading
import time

from ringtrain.backends import futex, spin
from ringtrain.backends.shm_segment import Segment, align
from ringtrain.engine.doorbell import Doorbell
from ringtrain.errors import HorovodInternalError
from ringtrain.proc_stat import is_alive

_LINE = 64
#: CPUs whose stores become visible to other cores in program order (x86's total store order):
#: there a bell can be read without the lock (see :meth:`ShmDoorbell.wait`).
STORES_IN_ORDER = ("x86_64", "amd64", "i386", "i686")
_ROUNDS = 2048
_BELL_ENTRY = 128  # round + 1, length, then the bell's bytes
_MAX_BELL = _BELL_ENTRY - 16
_COUNTERS = 16384
_COUNTER_ENTRY = 32  # two uint64 of digest, the value, padding
_COUNTER_WORDS = _COUNTER_ENTRY // 8
_COUNTERS_USED_MAX = _COUNTERS * 3 // 4
#: A rank waiting for the lock yields its core this long before it naps: the lock is held for
#: microseconds, and a nap (a timer's slack on top) costs a lone operation more than the whole
#: collective.
_LOCK_YIELD_S = 5e-4
#: A lock held this long means its holder is stopped (a dead one has lost it).
_LOCK_TIMEOUT_S = 30.0
#: A ring whose round's entry still holds a round some engine has not passed waits this long.
_REUSE_TIMEOUT_S = 60.0


def bytes_needed(size: int) -> int:
    """Bytes of a segment's data area that the doorbell of ``size`` ranks uses."""
    return _counters_offset(size) + _COUNTERS * _COUNTER_ENTRY


def _claims_offset(size: int) -> int:
    return _LINE + align(size * 8)


def _sleepers_offset(size: int) -> int:
    return _claims_offset(size) + align(size * 16)


def _bells_offset(size: int) -> int:
    return _sleepers_offset(size) + align(size * 16)


def _key_digest(key: bytes) -> int:
    """A unit's counter key as one int64 (never 0: 0 marks no claim)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little",
                          signed=True) or 1


def _counters_offset(size: int) -> int:
    return _bells_offset(size) + _ROUNDS * _BELL_ENTRY


class ShmDoorbell:
    """Bells and counters in a segment mapped by every rank of the world (all on this host).

    Args:
        segment: the segment, mapped with its file descriptor kept (``keep_fd``), whose data
            area holds at least :func:`bytes_needed` bytes; its members are the world's ranks.
        fallback: where counters go once the segment's table is full (the store's doorbell).
    """

    def __init__(self, segment: Segment, fallback: Doorbell):
        if segment.fd is None:
            raise ValueError("the doorbell's segment must keep its file descriptor (keep_fd)")
        size = segment.n
        data = segment.data_bytes()
        if data.size < bytes_needed(size):
            raise ValueError(f"the doorbell needs {bytes_needed(size)} bytes of data, the "
                             f"segment has {data.size}")
        self._segment = segment
        self._fd = segment.fd
        self._me = segment.me
        self._fallback = fallback
        self._thread_lock = threading.Lock()
        self._deferred = _Deferred()
        # The two futex words as memoryviews (a ring bumps both: Python ints, without numpy's
        # per-access cost), and their addresses for the futex calls.
        self._word = data[:4].data.cast("I")
        self._word_address = data[:4].__array_interface__["data"][0]
        self._callers_word = data[24:28].data.cast("I")
        self._callers_address = data[24:28].__array_interface__["data"][0]
        # The tables as int64 words (Python ints on every access, without numpy's per-call
        # cost): the header's, each rank's progress, each rank's claim (round + 1, key digest),
        # the bells (entry i's round + 1 at word i * _BELL_ENTRY // 8, its length next, then its
        # bytes) and the counters (entry i's digest at words 4 i and 4 i + 1, its value at 4 i + 2).
        self._header = data[:_LINE].data.cast("q")
        self._progress = data[_LINE:_LINE + size * 8].data.cast("q")
        self._claims = data[_claims_offset(size):_claims_offset(size) + size * 16].data.cast("q")
        sleepers = _sleepers_offset(size)
        self._sleepers = data[sleepers:sleepers + size * 16].data.cast("q")
        self._bell_bytes = data[_bells_offset(size):_counters_offset(size)].data
        self._bell_words = self._bell_bytes.cast("q")
        counters = data[_counters_offset(size):bytes_needed(size)].data
        self._digest_words = counters.cast("Q")
        self._values = counters.cast("q")
        self._lock_free_reads = platform.machine().lower() in STORES_IN_ORDER
        self._locked = _TableLock(self)  # the tables' lock
        self._deferring = _DeferredWakes(self)
        self._holding = _Holding(self)
        self._entries: dict[str, int] = {}  # counter keys found in the table (never moved)
        self._digests: dict[bytes, int] = {}

    # -- bells -----------------------------------------------------------------------------------

    def _bell_locked(self, round_: int) -> bytes | None:
        """Round ``round_``'s bell, if rung. Without the lock only where stores are seen in
        order: a ring writes the bell's bytes and length before its round, and the entry is not
        reused before every engine waits for a later round (this rank's does not yet)."""
        words, first = self._bell_words, round_ % _ROUNDS * (_BELL_ENTRY // 8)
        if words[first] != round_ + 1:
            return None
        start = round_ % _ROUNDS * _BELL_ENTRY + 16
        return bytes(self._bell_bytes[start:start + words[first + 1]])

    def ring(self, round_: int, bell: bytes) -> bytes:
        if len(bell) > _MAX_BELL:
            raise ValueError(f"a bell holds at most {_MAX_BELL} bytes, got {len(bell)}")
        deadline = time.monotonic() + _REUSE_TIMEOUT_S
        while True:
            with self._locked:
                words, first = self._bell_words, round_ % _ROUNDS * (_BELL_ENTRY // 8)
                held = words[first] - 1
                if held == round_:
                    return self._bell_locked(round_)  # type: ignore[return-value]
                lagging = min(self._progress)
                if held < lagging:  # a free entry, or one of a round every engine is past
                    # The bytes before the round: a reader without the lock that sees the
                    # round sees its bell (see _bell_locked).
                    start = round_ % _ROUNDS * _BELL_ENTRY + 16
                    self._bell_bytes[start:start + len(bell)] = bell
                    words[first + 1] = len(bell)
                    words[first] = round_ + 1
                    self._word[0] = (self._word[0] + 1) & 0xFFFFFFFF
                    self._callers_word[0] = (self._callers_word[0] + 1) & 0xFFFFFFFF
                    engines = not self._all_claimed(round_, bell)
                    break
            if time.monotonic() > deadline:
                slow = [self._segment.members[j].rank for j in range(self._segment.n)
                        if self._progress[j] <= held]
                raise HorovodInternalError(
                    f"rank {self._segment.members[self._me].rank} cannot ring round {round_}: "
                    f"rank(s) {slow} have not finished round {held} within "
                    f"{_REUSE_TIMEOUT_S:g} s, {_ROUNDS} rounds earlier")
            self._locked.pause(1e-3)  # a holding block of this thread's lets peers in
        if self._deferred.depth:
            self._deferred.owed = True
            self._deferred.engines = self._deferred.engines or engines
        else:
            self._wake(engines)
        return bell

    def _all_claimed(self, round_: int, bell: bytes) -> bool:
        """Whether every rank's caller claimed ``round_`` for the unit ``bell`` rings."""
        key = self._digest(bell.rpartition(b"@")[0])
        claims = self._claims
        for j in range(0, len(claims), 2):
            if claims[j] != round_ + 1 or claims[j + 1] != key:
                return False
        return True

    def _digest(self, key: bytes) -> int:
        """:func:`_key_digest`, remembered: a unit's key is claimed and rung again and again."""
        digest = self._digests.get(key)
        if digest is None:
            digest = _key_digest(key)
            if len(self._digests) < 4096:
                self._digests[key] = digest
        return digest

    def _wake(self, engines: bool) -> None:
        """Wake the callers, and the engines if ``engines``, that sleep on the words a ring has
        just bumped (after the lock, whose release orders the bump before the reads below)."""
        if self._sleeping(0):
            futex.wake(self._callers_address)
        if engines and self._sleeping(1):
            futex.wake(self._word_address)

    def _sleeping(self, which: int) -> bool:
        """Whether some rank's caller (``which`` 0) or engine (1) says it sleeps on its word: a
        wake-up is a system call of several microseconds (why no sleeper is missed:
        docs/shared_memory.md). Where stores may be seen out of order every ring wakes both."""
        if not self._lock_free_reads:
            return True
        sleepers = self._sleepers
        for j in range(which, len(sleepers), 2):
            if sleepers[j]:
                return True
        return False

    def claim(self, round_: int, key: str) -> None:
        # Without the lock (one writer per entry): a ring that reads the claim half written or
        # not yet visible does not match it and wakes the engines, as without a claim. The key
        # first: a new key beside an old claim's round matches no ring (that round is past).
        claims, mine = self._claims, 2 * self._me
        claims[mine + 1] = self._digest(key.encode())
        claims[mine] = round_ + 1

    def unclaim(self, wake: bool) -> None:
        if not wake:
            return  # the claimed round ran here: a claim of a past round matches no ring
        with self._locked:
            self._claims[2 * self._me] = 0  # the round first: no ring matches it then
            self._claims[2 * self._me + 1] = 0
        futex.wake(self._word_address)

    def deferring_wakes(self) -> _DeferredWakes:
        return self._deferring

    def holding(self) -> _Holding:
        return self._holding

    def _wake_owed(self) -> None:
        """Make the wakes this thread's rings owe, at the end of its outermost deferring
        block."""
        deferred = self._deferred
        if deferred.owed:
            deferred.owed = False
            engines, deferred.engines = deferred.engines, False
            self._wake(engines)

    def wait(self, round_: int, timeout_s: float, claimed: bool = False) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        word, address = ((self._callers_word, self._callers_address) if claimed
                         else (self._word, self._word_address))
        while True:
            if self._lock_free_reads:
                bell = self._bell_locked(round_)
                if bell is None and claimed:
                    # The peer about to ring holds the lock to count: looked for without it,
                    # for as long as a waiter spins (backends/spin.py), the bell is met as it
                    # lands, and the lock is taken only to sleep. Not by the engine's thread,
                    # whose spins hold the interpreter's lock beside the training thread.
                    spin_until = time.monotonic() + spin.spin_s()
                    while bell is None and time.monotonic() < spin_until:
                        bell = self._bell_locked(round_)
                if bell is not None:
                    # Only this rank writes its progress; a stale engine's write under the
                    # lock may lower it for a while, which only delays reusing an entry.
                    mine = self._progress
                    if mine[self._me] < round_:
                        mine[self._me] = round_
                    return bell
            with self._locked:
                # An engine that slept through rounds its callers ran waits for one that is
                # past: what this rank has done is the most any of its waits knew.
                self._progress[self._me] = max(self._progress[self._me], round_)
                bell = self._bell_locked(round_)
                if bell is not None:
                    return bell
                if self._bell_words[round_ % _ROUNDS * (_BELL_ENTRY // 8)] > round_ + 1:
                    # Its entry holds a later round: this rank's callers ran that round long
                    # ago; the engine must look up the round it is at.
                    return None
                seen = word[0]
            # A peer about to ring is met without a system call (how long: backends/spin.py).
            spin_until = time.monotonic() + spin.spin_s()
            while word[0] == seen and time.monotonic() < spin_until:
                pass
            if word[0] != seen:
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # Returns at once if a ring bumped the word since it was read.
            sleeper = 2 * self._me + (0 if claimed else 1)
            self._sleepers[sleeper] = 1
            try:
                futex.wait(address, seen, remaining)
            finally:
                self._sleepers[sleeper] = 0

    def forget(self, round_: int) -> None:
        """Nothing to release: an entry is reused once every engine waits for a later round."""

    # -- counters --------------------------------------------------------------------------------

    def _entry_locked(self, key: str, insert: bool) -> int | None:
        """The table entry of ``key`` (inserting it when asked and there is room), or None."""
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        d0 = int.from_bytes(digest[:8], "little") | 1  # never 0: 0 marks an empty entry
        d1 = int.from_bytes(digest[8:], "little")
        i = d0 % _COUNTERS
        digests = self._digest_words
        while True:
            first = digests[i * _COUNTER_WORDS]
            if first == 0:
                if not insert or self._header[2] >= _COUNTERS_USED_MAX:
                    return None
                digests[i * _COUNTER_WORDS], digests[i * _COUNTER_WORDS + 1] = d0, d1
                self._values[i * _COUNTER_WORDS + 2] = 0
                self._header[2] += 1
                return i
            if first == d0 and digests[i * _COUNTER_WORDS + 1] == d1:
                return i
            i = (i + 1) % _COUNTERS

    def count(self, key: str) -> int:
        with self._locked:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entry_locked(key, insert=True)
            if entry is not None:
                self._entries[key] = entry
                value = self._values[entry * _COUNTER_WORDS + 2] + 1
                self._values[entry * _COUNTER_WORDS + 2] = value
                return value
        return self._fallback.count(key)

    def read(self, key: str) -> int:
        with self._locked:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entry_locked(key, insert=False)
            if entry is not None:
                self._entries[key] = entry
                return self._values[entry * _COUNTER_WORDS + 2]
            if self._header[2] < _COUNTERS_USED_MAX:
                return 0  # the table had room all along: nobody counted it anywhere
        return self._fallback.read(key)


class _TableLock:
    """The tables' lock (see the module's docstring): this process's threads, then ``flock``
    between processes; the holder's rank + 1 in the header while held. Re-entrant, so that a
    count and the ring it completes take it once (:meth:`ShmDoorbell.holding`). A class rather
    than a generator: it is taken several times per operation."""

    __slots__ = ("_bell", "_depth", "_owner")

    def __init__(self, bell: ShmDoorbell):
        self._bell = bell
        self._owner: int | None = None  # the holding thread: only it ever reads its own id here
        self._depth = 0

    def __enter__(self) -> None:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return
        bell = self._bell
        bell._thread_lock.acquire()
        try:
            self._flock()
        except BaseException:
            bell._thread_lock.release()
            raise
        bell._header[1] = bell._me + 1
        self._owner, self._depth = me, 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        self._owner = None
        bell = self._bell
        try:
            bell._header[1] = 0
            fcntl.flock(bell._fd, fcntl.LOCK_UN)
        finally:
            bell._thread_lock.release()

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` with the lock let go, however deep this thread holds it (a ring
        waiting for a peer that needs the lock to move on), then hold it as deep again."""
        if self._owner != threading.get_ident():
            time.sleep(seconds)
            return
        depth = self._depth
        self._depth = 1
        self.__exit__()
        try:
            time.sleep(seconds)
        finally:
            self.__enter__()
            self._depth = depth

    def _flock(self) -> None:
        fd = self._bell._fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        start = time.monotonic()
        nap = 1e-4
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            except OSError as exc:  # pragma: no cover - EINTR is retried by Python itself
                if exc.errno != errno.EINTR:
                    raise
            waited = time.monotonic() - start
            if waited > _LOCK_TIMEOUT_S:
                raise HorovodInternalError(self._stuck(waited))
            if waited < _LOCK_YIELD_S:
                os.sched_yield()
            else:
                time.sleep(nap)
                nap = min(nap * 2, 1e-3)

    def _stuck(self, waited: float) -> str:
        """Why the lock could not be taken: the holder named, and whether its process lives."""
        segment = self._bell._segment
        holder = self._bell._header[1] - 1
        me = segment.members[self._bell._me].rank
        if holder < 0 or holder >= segment.n:
            return (f"rank {me} could not take the shared-memory doorbell's lock within "
                    f"{waited:.0f} s")
        member = segment.members[holder]
        state = ("alive but not running (stopped or frozen?)"
                 if is_alive(member.pid, None if member.start_ticks < 0 else member.start_ticks)
                 else "gone")
        return (f"rank {member.rank} (pid {member.pid}) has held the shared-memory doorbell's "
                f"lock for {waited:.0f} s while rank {me} waited for it: its process is {state}")


class _Deferred(threading.local):
    """A thread's deferring_wakes blocks: how deep, and the wakes its rings owe (class
    defaults: a missing attribute of a thread-local costs an exception on every look)."""

    depth = 0
    owed = False
    engines = False


class _DeferredWakes:
    """What :meth:`ShmDoorbell.deferring_wakes` returns: one object for every block (each
    submission enters one), the depth of this thread's blocks kept per thread."""

    __slots__ = ("_bell",)

    def __init__(self, bell: ShmDoorbell):
        self._bell = bell

    def __enter__(self) -> None:
        deferred = self._bell._deferred
        deferred.depth += 1

    def __exit__(self, *exc: object) -> None:
        deferred = self._bell._deferred
        deferred.depth -= 1
        if not deferred.depth:
            self._bell._wake_owed()


class _Holding:
    """What :meth:`ShmDoorbell.holding` returns: the tables' lock held, and the wakes of the
    block's rings deferred to its end, when the lock is let go (a wake reads the sleepers
    table only after the lock's release orders the ring before it: see ``ShmDoorbell._wake``)."""

    __slots__ = ("_bell",)

    def __init__(self, bell: ShmDoorbell):
        self._bell = bell

    def __enter__(self) -> None:
        self._bell._deferring.__enter__()
        try:
            self._bell._locked.__enter__()
        except BaseException:
            self._bell._deferring.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._bell._locked.__exit__()
        finally:
            self._bell._deferring.__exit__()
