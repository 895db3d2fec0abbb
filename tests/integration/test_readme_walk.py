"""The README, followed in order by a newcomer: every ```bash block of README.md runs, in order,
as one shell session on a fresh RINGTRAIN_HOME in a copy of the repository, with the training
cut short by the substitutions below (each must match exactly once, so that the README and this
test cannot drift apart). ```sh blocks (set-up, a Ray cluster of your own) are not run here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from ringtrain.jobs.client.connection import stop_server
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.executors.node_launch import free_port

ROOT = Path(__file__).resolve().parents[2]
SMALL = "--limit-train 512 --limit-test 200"
#: README text -> what runs instead (fewer images and epochs).
CUTS = {
    "python examples/fashion_mnist.py --epochs 2": f"python examples/fashion_mnist.py --epochs 2 "
                                                    f"{SMALL}",
    "examples/horovod_mnist.py --epochs 1": "examples/horovod_mnist.py --epochs 1 --limit 1000",
    "examples/fashion_mnist_job.yaml --cluster local)": "examples/fashion_mnist_job.yaml "
                                                         f"--cluster local --args='{SMALL}')",
}


def readme_commands(text: str) -> list[str]:
    """The contents of the README's ```bash blocks, in order."""
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def _copy_repo(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    (dest / ".venv").symlink_to((ROOT / ".venv").resolve())
    return dest


def test_the_readme_blocks_are_found_and_every_cut_applies() -> None:
    script = "\n".join(readme_commands((ROOT / "README.md").read_text()))
    assert "ringtrain cluster create local" in script and "ringtrain serve" in script
    for text in CUTS:
        assert script.count(text) == 1, f"the README no longer says {text!r} once"


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "ringtrain").exists(),
                    reason="needs the set-up's .venv")
@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="needs the dataset-fashion-mnist package")
def test_the_readme_runs_in_order_on_a_fresh_home(tmp_path: Path) -> None:
    repo = _copy_repo(tmp_path / "repo")
    script = "\n".join(readme_commands((ROOT / "README.md").read_text()))
    port = str(free_port("127.0.0.1"))  # 8080 may be taken on a shared machine
    for text, cut in {**CUTS, "--port 8080": f"--port {port}",
                      "127.0.0.1:8080/": f"127.0.0.1:{port}/"}.items():
        assert script.count(text) == 1, text
        script = script.replace(text, cut)
    (tmp_path / "walk.sh").write_text("set -euxo pipefail\n" + script)
    home = Home(tmp_path / "home")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RINGTRAIN_", "HOROVOD_")) and k != "VIRTUAL_ENV"}
    env.update(RINGTRAIN_HOME=str(home.root), PYTHONPATH=str(repo))
    proc = subprocess.Popen(["bash", str(tmp_path / "walk.sh")], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=900)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a server the walk left behind
        except ProcessLookupError:
            pass
        stop_server(home)
    assert proc.returncode == 0, out[-8000:]
    assert "test accuracy" in out and "over 2 processes" in out
    assert re.search(r'"model_name":\s*"model"', out) and "Ankle boot" in out, out[-3000:]
    assert (repo / "out" / "model" / "model.json").is_file()
