"""Dependencies by use: the core (``import ringtrain.torch``, ``ringtrain run``) needs none of
the job service's or the model server's packages, and a command whose optional extra is missing
names the extra to install. Each case runs in a fresh interpreter in which the packages of the
extras cannot be imported, as on a machine that installed only the core."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCK + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_the_torch_frontend_and_the_launcher_need_no_extra() -> None:
    out = _run("""
        import ringtrain.torch, ringtrain.runner.cli, ringtrain.runner.launch
        print("imported")
    """)
    assert out.returncode == 0 and "imported" in out.stdout, out.stderr


def test_a_command_without_its_extra_names_the_extra() -> None:
    for argv, extra in ((["job", "list"], "jobs"), (["cluster", "list"], "jobs"),
                        (["serve", "my-job-1"], "serve"),
                        (["data", "fashion-images", "out-folder"], "vision")):
        command = argv[0]
        out = _run(f"""
            import sys
            from ringtrain.cli import main
            sys.exit(main({argv!r}))
        """)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert f"needs the '{extra}' extra" in out.stderr, (command, out.stderr)
        assert f"pip install 'ringtrain[{extra}]'" in out.stderr
        assert "Traceback" not in out.stderr
