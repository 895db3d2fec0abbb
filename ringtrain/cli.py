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
    "secret": ("ringtrain.jobs.cli", "keep object storage credentials in the service's home"),
    "login": ("ringtrain.jobs.cli", "use a job service on another machine (URL, token, pin)"),
    "logout": ("ringtrain.jobs.cli", "forget a job service of `ringtrain login`"),
    "token": ("ringtrain.jobs.cli", "create, list and revoke scoped tokens (read, submit)"),
    "serve": ("ringtrain.serve.cli", "serve a trained model over HTTP (KServe v2, images)"),
    "data": ("ringtrain.data.cli", "build data sets on disk (image folders, COCO, packed)"),
    "doctor": ("ringtrain.doctor.cli", "find and fix input-pipeline bottlenecks"),
    "env": ("ringtrain.env_report", "print the environment block for bug reports"),
}


#: The optional extra (pyproject.toml) that brings each top-level package a command may import.
_EXTRA_OF_PACKAGE: dict[str, str] = {
    **dict.fromkeys(("fastapi", "starlette", "uvicorn", "pydantic", "httpx", "pathspec",
                     "fastapi_offline", "prometheus_client", "cryptography"), "jobs"),
    **dict.fromkeys(("torchvision", "PIL", "pycocotools", "matplotlib", "simplejpeg", "tqdm"),
                    "vision"),
    **dict.fromkeys(("fsspec", "s3fs", "adlfs", "gcsfs", "aiohttp"), "storage"),
    "ray": "ray", "keras": "keras", "bayes_opt": "autotune", "tensorboard": "tensorboard",
}
#: Commands whose web stack is the model server's extra rather than the job service's.
_WEB_EXTRA = {"serve": "serve"}


def missing_extra(command: str, error: ModuleNotFoundError) -> str | None:
    """What to install when ``command`` failed to import ``error.name``: a line naming the
    extra, or ``None`` when the module is no dependency of an extra (a bug, to be raised)."""
    package = (error.name or "").split(".")[0]
    extra = _EXTRA_OF_PACKAGE.get(package)
    if extra is None:
        return None
    if extra == "jobs":
        extra = _WEB_EXTRA.get(command, extra)
    return (f"ringtrain {command}: needs the '{extra}' extra ({package} is not installed): "
            f"pip install 'ringtrain[{extra}]'")


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
    try:
        module = importlib.import_module(_COMMANDS[command][0])
        # Groups that share a module get their own name as the first argument.
        rest = argv if _COMMANDS[command][0] == "ringtrain.jobs.cli" else argv[1:]
        return int(module.main(rest) or 0)
    except ModuleNotFoundError as e:  # an optional dependency, imported late by some commands
        hint = missing_extra(command, e)
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
