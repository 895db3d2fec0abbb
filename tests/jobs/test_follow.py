"""`job logs --follow` outlives the server: killed and restarted mid-follow, the follower
reconnects and goes on from the last byte it got, to the end of the job. A real server, killed
with SIGKILL, and the CLI in a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from ringtrain import proc_stat
from ringtrain.jobs.client.connection import read_server_file
from ringtrain.jobs.home import Home

from .conftest import CLI, wait_for

LINES = 60
TICKER = (f"python -c \"import time\nfor i in range({LINES}):\n    print('line', i, flush=True); "
          "time.sleep(0.1)\"")


def test_follow_survives_a_server_restart(home: Home, cli: CLI, tmp_path: Path) -> None:
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    spec = tmp_path / "ticker.yaml"
    spec.write_text(yaml.safe_dump({"name": "ticker", "node_count": 1, "command": TICKER}))
    rc, out, _ = cli("job", "submit", str(spec), "--cluster", "c")
    job_id = out.strip()
    follower = subprocess.Popen(
        [sys.executable, "-m", "ringtrain.cli", "job", "logs", job_id, "--follow"],
        env={**os.environ, "RINGTRAIN_HOME": str(home.root)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    try:
        log = home.share_root / "jobs" / job_id / "stdouterr/rank.0/stdout"
        wait_for(lambda: log.exists() and log.read_bytes().count(b"\n") >= 10, timeout_s=90)
        first = read_server_file(home)
        os.kill(first.pid, signal.SIGKILL)
        wait_for(lambda: not proc_stat.is_alive(first.pid, None), timeout_s=10)
        assert follower.poll() is None  # waiting for the server to come back
        assert cli("server", "start")[0] == 0
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert read_server_file(home).pid != first.pid
    assert b"Traceback" not in err, err.decode()
    assert out.decode().splitlines() == [f"line {i}" for i in range(LINES)]
    assert follower.returncode == 0
    assert f"job {job_id} succeeded".encode() in err
