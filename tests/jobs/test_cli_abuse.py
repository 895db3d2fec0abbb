"""The CLI under abuse (issue 15): malformed ids, traversal, hostile spec files and download
paths end with exit 2 and a message saying what is wrong, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ringtrain.jobs.home import Home

from .conftest import CLI, returns_within, wait_for
from .test_spec import LAUGHS


@pytest.mark.parametrize("args,says", [
    (("job", "delete", "../clusters/victim"), "invalid job id '../clusters/victim'"),
    (("job", "show", "../clusters"), "invalid job id '../clusters'"),
    (("job", "logs", "x" * 5000), "invalid job id 'xxxx"),
    (("job", "files", "a/b-123456"), "six hex digits"),
    (("job", "download", "..", "outputs"), "invalid job id '..'"),
    (("job", "terminate", "job-12345g"), "invalid job id"),
    (("job", "list", "--cluster", "../x"), "invalid cluster name '../x'"),
    (("job", "list", "--experiment", "a b"), "invalid experiment 'a b'"),
    (("cluster", "show", "../jobs"), "invalid cluster name '../jobs'"),
    (("cluster", "delete", "a/../b"), "invalid cluster name"),
    (("cluster", "resize", "..", "--nodes", "1"), "invalid cluster name"),
])
def test_malformed_ids_exit_2_before_any_server(home: Home, cli: CLI, args: tuple[str, ...],
                                                says: str) -> None:
    rc, _, err = cli(*args)
    assert rc == 2 and says in err, err
    assert "Traceback" not in err and len(err) < 1000
    assert not home.server_file.exists()


def write(tmp_path: Path, name: str, content: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def test_traversal_and_hostile_input_through_the_cli(home: Home, cli: CLI,
                                                     tmp_path: Path) -> None:
    assert cli("cluster", "create", "victim", "--nodes", "0")[0] == 0
    rc, _, err = cli("job", "delete", "../clusters/victim")
    assert rc == 2 and "invalid job id" in err
    assert json.loads(cli("cluster", "show", "victim", "-o", "json")[1])["name"] == "victim"

    spec = write(tmp_path, "ok.yaml", "name: dl\nnode_count: 1\ncommand: 'true'\noutputs: [o]\n")
    rc, out, err = cli("job", "submit", spec, "--cluster", "victim")
    assert rc == 0, err
    job_id = out.strip()
    rc, _, err = cli("job", "download", job_id, "outputs/..", "--to", str(tmp_path / "dl"))
    assert rc == 2 and "ends in '..'" in err
    rc, _, err = cli("job", "files", job_id, "outputs/" + "a" * 256)
    assert rc == 2 and "longer than 255 bytes" in err

    hostile = {
        "latin1.yaml": ("node_count: 1\ncommand: echo café\n".encode("latin-1"), "not UTF-8"),
        "bomb.yaml": (LAUGHS, "more than 10000 values once aliases are expanded"),
        "inf.yaml": ("node_count: 1\ncommand: x\nmax_wall_clock_time: .inf\n", "finite"),
        "nul.json": ('{"node_count": 1, "command": "x", "working_dir": "a\\u0000b"}', "NUL"),
        "long.yaml": ("node_count: 1\ncommand: x\nworking_dir: /tmp/" + "a" * 256 + "\n",
                      "longer than 255 bytes"),
        "user.yaml": ("node_count: 1\ncommand: x\nworking_dir: ~nosuchuser_rt/x\n",
                      "working_dir: cannot use"),
    }
    for name, (content, says) in hostile.items():
        rc, _, err = returns_within(30, cli, "job", "submit", write(tmp_path, name, content),
                                    "--cluster", "victim")
        assert rc == 2 and says in err, (name, err)
        assert "Traceback" not in err and len(err) < 2000, name

    pipe_wd = tmp_path / "wd"
    pipe_wd.mkdir()
    os.mkfifo(pipe_wd / "fifo")
    spec = write(tmp_path, "pipe.yaml", f"node_count: 1\ncommand: x\nworking_dir: {pipe_wd}\n")
    # Copied after the submit answers: the job fails then and `job show` says why.
    rc, out, err = cli("job", "submit", spec, "--cluster", "victim", "-o", "json")
    assert rc == 0, err
    job_id = json.loads(out)["id"]
    shown = wait_for(lambda: (j := json.loads(cli("job", "show", job_id, "-o", "json")[1]))
                     ["state"] == "failed" and j, timeout_s=30)
    assert "fifo' is a named pipe" in shown["message"], shown
