"""What of a working dir a job gets: .gitignore and .ringtrainignore honoured (nested too),
environments and any ringtrain home (token included) never copied; `job submit` shows the size
and refuses a working dir above its limit."""

from __future__ import annotations

import json
from pathlib import Path

from ringtrain.jobs.files.workdir import plan_copy
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import parse_job_spec
from ringtrain.jobs.service.share import Share

from .conftest import CLI


def _project(root: Path) -> Path:
    for path, text in {"train.py": "print('hi')\n", ".gitignore": "data/\n*.log\n!keep.log\n",
                       ".ringtrainignore": "/out\n", "out/model.pt": "x" * 100,
                       "data/big.bin": "x" * 5000, "run.log": "log", "keep.log": "kept",
                       "pkg/mod.py": "", "pkg/.gitignore": "scratch/\n",
                       "pkg/scratch/tmp.txt": "t", "pkg/out/ok.txt": "nested out is kept",
                       "home/token": "secret", "home/jobs.sqlite": "", "home/server.json": "{}",
                       ".venv/bin/python": "", ".git/HEAD": ""}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def _copied(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def test_the_copy_leaves_out_ignored_files_and_any_ringtrain_home(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    share = Share(tmp_path / "share")
    job_dir = share.create_job_dir("j1", parse_job_spec(
        {"node_count": 1, "command": "true", "working_dir": str(project)}))
    assert _copied(job_dir / "wd") == {"train.py", ".gitignore", ".ringtrainignore", "keep.log",
                                       "pkg/mod.py", "pkg/.gitignore", "pkg/out/ok.txt"}
    plan = plan_copy(project)
    assert plan.files == 7 and plan.bytes == sum(
        (project / p).stat().st_size for p in _copied(job_dir / "wd"))
    assert {"data/", "out/", "run.log", "home/", ".venv/", ".git/", "pkg/scratch/"} <= set(
        plan.skipped)


def test_submit_shows_the_size_and_refuses_past_the_limit(home: Home, cli: CLI,
                                                         tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    (project / "weights.bin").write_bytes(b"w" * 300_000)
    spec = project / "job.yaml"
    spec.write_text(f"node_count: 1\ncommand: ls\nworking_dir: {project}\n")
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c", "--max-working-dir-mb",
                       "0.1")
    assert rc != 0 and "more than --max-working-dir-mb 0.1" in err and ".ringtrainignore" in err
    assert cli("job", "list", "-o", "json")[1].strip() == "[]"
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c", "-o", "json")
    assert rc == 0, err
    assert "9 files, 300.2 kB to copy" in err and "skipped: " in err
    assert json.loads(out)["id"]
