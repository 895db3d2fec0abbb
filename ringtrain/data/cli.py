"""`ringtrain data ...`: commands that build data sets on disk, one module per command.

Each command module (listed in :data:`_COMMANDS`) has ``add_parser(subparsers)``, which adds its
subcommand and sets ``func(args) -> int`` on it. Exit codes: 0 done; 2 bad input (a missing source,
a bad flag, an output folder that is not empty).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ringtrain.errors import RingtrainError

_COMMANDS = (
    "ringtrain.data.commands.fashion_images",
    "ringtrain.data.commands.photos",
    "ringtrain.data.commands.pack",
    "ringtrain.data.commands.deepforest_coco",
)


def main(argv: list[str]) -> int:
    """Run one ``ringtrain data`` subcommand."""
    parser = argparse.ArgumentParser(prog="ringtrain data", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(metavar="COMMAND")
    for name in _COMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (RingtrainError, OSError) as e:  # a missing source, a full disk, a non-empty folder
        print(f"ringtrain data: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
