"""What to do about a rank's failure, read from the last lines of its stderr.

Only failures whose cause is unambiguous get a hint; the others are reported as they are.
"""

from __future__ import annotations

from collections.abc import Iterable

_NO_HOROVOD = "No module named 'horovod"


def failure_hint(stderr_tail: Iterable[str]) -> str | None:
    """A one-clause explanation with the fix, or ``None`` when the lines suggest none.

    Args:
        stderr_tail: The rank's last stderr lines, oldest first.
    """
    for line in stderr_tail:
        if line.startswith("ModuleNotFoundError:") and _NO_HOROVOD in line:
            return ("the script imports horovod, which is not installed: run it with "
                    "`ringtrain run --horovod-compat ...` (then `import horovod.torch` loads "
                    "ringtrain), or import ringtrain.torch as hvd")
    return None
