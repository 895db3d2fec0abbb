"""Following a job shows its preparation step's output, then rank 0's stdout and stderr
interleaved as written (`--stdout-only` for stdout alone); `job logs --prep` shows the step's."""

from __future__ import annotations

import json
from pathlib import Path

from ringtrain.jobs.home import Home

from .conftest import CLI

SCRIPT = """import sys, time
for i in range(3):
    print(f"out{i}", flush=True)
    time.sleep(0.05)
    print(f"err{i}", file=sys.stderr, flush=True)
    time.sleep(0.05)
"""


def test_follow_shows_prep_then_both_streams_in_order(home: Home, cli: CLI,
                                                      tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "wd" / "talk.py").write_text(SCRIPT)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"node_count: 1\nworking_dir: {tmp_path / 'wd'}\n"
                    "job_preparation: echo preparing; echo prep-warning >&2\n"
                    "command: python talk.py\n")
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c", "--follow")
    assert rc == 0, err
    lines = [x for x in out.splitlines() if x and not x.startswith("ringtrain run:")]
    job_id = lines[0]
    shown = [x for x in lines[1:] if x in {"preparing", "prep-warning"} or x[:3] in ("out", "err")]
    assert shown == ["preparing", "prep-warning", "out0", "err0", "out1", "err1", "out2", "err2"]
    assert cli("job", "logs", job_id, "--stdout-only")[1].split() == ["out0", "out1", "out2"]
    assert cli("job", "logs", job_id, "--stderr")[1].split()[-3:] == ["err0", "err1", "err2"]
    assert cli("job", "logs", job_id, "--prep")[1].split() == ["preparing", "prep-warning"]
    rc, out, _ = cli("job", "logs", job_id, "-o", "json")
    assert "out0\nerr0\n" in json.loads(out)["text"]
