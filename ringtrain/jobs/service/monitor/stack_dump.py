"""A Python process's stacks, as py-spy dumps them: the job page's *Stack dump* of a rank (what
Ray's dashboard calls a stack trace).

py-spy reads the target's memory through ptrace to walk its Python frames, without running code
in it; the target is paused while it reads. A local job's ranks run as the user the service runs
as, which may trace them where the kernel lets a user trace its own processes (Yama's
``ptrace_scope`` 0, or a service with ``CAP_SYS_PTRACE``, as root has); with ``ptrace_scope`` 1
only ancestors may, and the error says so.

py-spy is a binary wheel on PyPI, in the ``jobs`` extra; without it the dump is refused with how
to install it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from ringtrain.jobs.errors import ConflictError, ServiceUnavailableError

#: Seconds py-spy may take before it is stopped (a dump takes well under one).
DUMP_TIMEOUT_S = 10.0
#: The most characters of a dump returned (thousands of threads would make megabytes).
MAX_DUMP_CHARS = 1_000_000


def find_py_spy() -> str | None:
    """The py-spy executable: the one installed beside this Python (a virtualenv whose ``bin``
    is not on ``PATH``), else one on ``PATH``; ``None`` if neither is there."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return str(beside)
    return shutil.which("py-spy")


def dump_stack(pid: int, py_spy: str | None = None,
               timeout_s: float = DUMP_TIMEOUT_S) -> str:
    """The stack of every thread of the Python process ``pid``, as ``py-spy dump`` (``py_spy``,
    default :func:`find_py_spy`) prints it.

    Raises:
        ServiceUnavailableError: py-spy is not installed, or took longer than ``timeout_s``
            (503).
        ConflictError: py-spy could not dump the process (gone, not Python, not allowed; 409),
            with what py-spy said.
    """
    exe = py_spy or find_py_spy()
    if exe is None or not Path(exe).is_file():
        raise ServiceUnavailableError(
            "py-spy is not installed where the job service runs: install it into the service's "
            f"environment ({sys.prefix}) with `pip install py-spy` (or `pip install "
            "'ringtrain[jobs]'`), then ask again; no restart is needed")
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:  # run() killed it
        raise ServiceUnavailableError(f"py-spy did not dump process {pid} within {timeout_s:g} "
                                      "s; ask again") from None
    out = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0 or not out.strip():
        said = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-2000:]
        hint = ""
        if "ermission" in said or "not permitted" in said:
            hint = (" (the kernel refuses to let the service trace it: set "
                    "kernel.yama.ptrace_scope to 0, or run the service with CAP_SYS_PTRACE)")
        raise ConflictError(f"py-spy could not dump process {pid}{hint}: {said or 'no output'}")
    return out[:MAX_DUMP_CHARS]
