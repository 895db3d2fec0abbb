"""Blocking waits on a 32-bit word of shared memory that wake when another process changes it.

Linux's futex system call, reached through ``ctypes`` (no compiler): :func:`wait` sleeps in the
kernel while the word still holds the value the caller last saw, and :func:`wake` wakes every
sleeper on the word once the writer has changed it. The kernel keys a futex of a shared file
mapping by its file and offset, so processes that map the same segment meet on the same word.

Where the system call cannot be reached (another OS, a CPU whose call number is not known here),
:func:`wait` naps instead, briefly enough that a wake-up is still noticed within a millisecond.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time

#: The futex system call's number, by CPU (Linux's own tables).
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_EAGAIN, _EINTR, _ETIMEDOUT = 11, 4, 110
_WAKE_ALL = 0x7FFFFFFF
#: The nap of the fallback (no futex here).
_NAP_S = 5e-4


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _syscall():
    """libc's ``syscall`` and the futex call's number, or None where they are not usable."""
    number = _SYS_FUTEX.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    return call, number


_CALL: tuple | None | bool = False  # False: not looked up yet (no work at import time)


def _futex():
    global _CALL
    if _CALL is False:
        _CALL = _syscall()
    return _CALL


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep until the 32-bit word at ``address`` (in a shared mapping that stays mapped
    meanwhile) is woken or no longer ``expected`` (unsigned), or for ``timeout_s`` at most. May
    return early (a signal, a wake-up meant for another value): callers check again."""
    futex = _futex()
    if futex is None:
        time.sleep(min(max(timeout_s, 0.0), _NAP_S))
        return
    call, number = futex
    timeout_s = max(timeout_s, 0.0)
    spec = _Timespec(int(timeout_s), int((timeout_s % 1.0) * 1e9))
    result = call(ctypes.c_long(number), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAIT),
                  ctypes.c_uint32(expected), ctypes.byref(spec), None, ctypes.c_int(0))
    if result == -1:
        err = ctypes.get_errno()
        if err not in (_EAGAIN, _EINTR, _ETIMEDOUT):
            raise OSError(err, f"futex wait failed: {os.strerror(err)}")


def wake(address: int) -> None:
    """Wake every process and thread sleeping on the 32-bit word at ``address``."""
    futex = _futex()
    if futex is None:
        return
    call, number = futex
    result = call(ctypes.c_long(number), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAKE),
                  ctypes.c_int(_WAKE_ALL), None, None, ctypes.c_int(0))
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"futex wake failed: {os.strerror(err)}")
