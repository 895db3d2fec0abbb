"""Checks of the user's command before anything starts, so that a typo fails in a second with a
clear message instead of as N identical rank failures."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from ringtrain.errors import ConfigError

_PYTHON = re.compile(r"python[0-9.]*|pypy[0-9.]*")
# Interpreter options that consume the next argument; -c and -m end the search for a script.
_PYTHON_OPTIONS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


def check_command(command: Sequence[str], cwd: str, environ: Mapping[str, str]) -> None:
    """Check that the program exists and, for ``python SCRIPT``, that the script exists.

    Both are looked up as a local rank would: the program on the launcher's PATH, the script
    relative to ``cwd``.

    Raises:
        ConfigError: the program or the script does not exist.
    """
    program = command[0]
    resolved = shutil.which(program, path=environ.get("PATH"))
    if resolved is None and "/" in program:
        raise ConfigError(f"command {program!r} does not exist or is not executable")
    if resolved is None:
        raise ConfigError(f"command {program!r} is not on PATH")
    script = python_script(command)
    if script is not None and not (Path(cwd) / script).is_file():
        raise ConfigError(f"{script}: no such file (looked in {cwd}); check the script's path")


def python_script(command: Sequence[str]) -> str | None:
    """The script a ``python [OPTIONS] SCRIPT ...`` command runs, or ``None`` if it runs none
    (``-c``, ``-m``, stdin) or is not a Python command."""
    if not _PYTHON.fullmatch(Path(command[0]).name):
        return None
    args = iter(command[1:])
    for arg in args:
        if arg in ("-c", "-m", "-") or arg.startswith(("-c", "-m")) and not arg.startswith("--"):
            return None
        if arg in _PYTHON_OPTIONS_WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None
