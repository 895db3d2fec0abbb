"""Dependencies by use: the core (``import ringtrain.torch``, ``ringtrain run``) needs none of
the job service's or the model server's packages, and a command whose optional extra is missing
names the extra to install. The cases run in a fresh interpreter in which the packages of the
extras cannot be imported, as on a machine that installed only the core."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

_BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = {"fastapi", "starlette", "uvicorn", "pydantic", "httpx", "pathspec",
               "fastapi_offline", "prometheus_client", "torchvision", "PIL", "pycocotools",
               "matplotlib", "simplejpeg", "ray", "keras"}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
""")


_COMMANDS = ((["job", "list"], "jobs"), (["cluster", "list"], "jobs"),
             (["serve", "my-job-1"], "serve"), (["data", "fashion-images", "out-folder"], "vision"))

# One interpreter for every case (each one started with torch took ~2 s of the fast tier on a
# loaded 2-core machine): the core is imported first, as on a fresh machine, then each command
# runs through `ringtrain`'s entry point with its own stderr; an exception it lets out is
# written there as a traceback, as the console script would.
_CASES = """
    import contextlib, io, json, traceback
    import ringtrain.torch, ringtrain.runner.cli, ringtrain.runner.launch
    print("imported", flush=True)
    from ringtrain.cli import main
    results = []
    for argv in ARGVS:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
            except BaseException:
                traceback.print_exc()
                code = None
        results.append([code, err.getvalue()])
    print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def cases() -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(_CASES).replace("ARGVS", repr([argv for argv, _ in _COMMANDS]))
    return subprocess.run([sys.executable, "-c", _BLOCK + code], capture_output=True,
                          text=True, timeout=120)


def test_the_torch_frontend_and_the_launcher_need_no_extra(cases) -> None:
    assert cases.stdout.startswith("imported\n"), cases.stderr


def test_a_command_without_its_extra_names_the_extra(cases) -> None:
    assert cases.returncode == 0, cases.stderr
    results = json.loads(cases.stdout.splitlines()[-1])
    for (argv, extra), (code, stderr) in zip(_COMMANDS, results, strict=True):
        command = argv[0]
        assert code == 2, (command, stderr)
        assert f"needs the '{extra}' extra" in stderr, (command, stderr)
        assert f"pip install 'ringtrain[{extra}]'" in stderr
        assert "Traceback" not in stderr
