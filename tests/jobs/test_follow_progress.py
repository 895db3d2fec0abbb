"""A progress bar reaches `job logs --follow` while its line is unfinished: tqdm redraws one
line with "\\r" on stderr, and the follower (rank 0's stdout and stderr as written) shows each
update as it comes, not once the epoch's line ends. A real server and the CLI in a process of
its own."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from ringtrain.jobs.home import Home

from .conftest import CLI, wait_for


def test_follow_shows_a_progress_bar_as_it_moves(home: Home, cli: CLI, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    bar = (f"python -c \"import os, time\nfrom tqdm import tqdm\n"
           f"with tqdm(total=1000, desc='epoch 1', mininterval=0) as bar:\n"
           f"    for _ in range(600):\n"
           f"        if os.path.exists('{stop}'): break\n"
           f"        bar.update(1); time.sleep(0.1)\"")
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    spec = tmp_path / "bar.yaml"
    spec.write_text(yaml.safe_dump({"name": "bar", "node_count": 1, "command": bar}))
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c")
    assert rc == 0, err
    job_id = out.strip()
    follower = subprocess.Popen(
        [sys.executable, "-m", "ringtrain.cli", "job", "logs", job_id, "--follow"],
        env={**os.environ, "RINGTRAIN_HOME": str(home.root)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    got = bytearray()

    def read() -> None:
        assert follower.stdout is not None
        while chunk := follower.stdout.read1(4096):
            got.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: b"epoch 1:" in got and b"5/1000" in got, timeout_s=90)
        assert b"\n" not in got.split(b"epoch 1:", 1)[1]  # its line is still unfinished
        assert b"\r" in got  # each update redraws the line, as in a terminal
    finally:
        stop.touch()
        try:
            follower.wait(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
    reader.join(10)
    assert follower.returncode == 0, follower.stderr.read().decode() if follower.stderr else ""
    assert b"epoch 1:" in got.rstrip(b"\n").split(b"\n")[-1]  # the bar's last state ends it
