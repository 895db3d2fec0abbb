"""The `ringtrain` command: a thin dispatcher over one module per command group.

Each group's module is imported only when that group runs, so `ringtrain job ...` never imports
torch and `ringtrain run` starts quickly.
"""

from __future__ import annotations

import importlib
import sys

# command -> module with a `main(argv: list[str]) -> int`
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ringtrain.runner.cli", "launch a distributed training job (horovodrun's flags)"),
    "job": ("ringtrain.jobs.cli", "submit, watch and manage training jobs"),
    "cluster": ("ringtrain.jobs.cli", "create, resize and delete job clusters"),
    "server": ("ringtrain.jobs.cli", "run or stop the job service"),
    "deployment": ("ringtrain.jobs.cli", "list, show and stop served models (job deploy)"),
    "dashboard": ("ringtrain.jobs.cli", "print the job service's web dashboard URL (--open)"),
    "serve": ("ringtrain.serve.cli", "serve a trained model over HTTP (KServe v2, images)"),
    "data": ("ringtrain.data.cli", "build data sets on disk (image folders, COCO, packed)"),
    "doctor": ("ringtrain.doctor.cli", "find and fix input-pipeline bottlenecks"),
    "env": ("ringtrain.env_report", "print the environment block for bug reports"),
}


def _usage() -> str:
    lines = ["usage: ringtrain COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in _COMMANDS.items()]
    lines += ["", "`ringtrain COMMAND --help` describes each command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ringtrain` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from ringtrain import __version__

        print(f"ringtrain {__version__}")
        return 0
    command = argv[0]
    if command not in _COMMANDS:
        print(f"ringtrain: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[command][0])
    # Groups that share a module get their own name as the first argument.
    rest = argv if _COMMANDS[command][0] == "ringtrain.jobs.cli" else argv[1:]
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
