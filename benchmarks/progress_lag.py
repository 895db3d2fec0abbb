"""How long a rank's progress update takes to reach `job logs --follow`, against a whole line.

A job on a local cluster writes, every ``--interval`` seconds, its clock as a progress update on
stderr (``\\r`` then the text, left unfinished, as tqdm does) and, half an interval later, as a
whole line on stdout. A follower of rank 0's output (stdout and stderr as written: what
``ringtrain job logs --follow`` and the dashboard's log pane read) notes when each arrives.
Prints one JSON line: the median and worst lag of each kind and the ratio of the progress
update's median lag to the line's. Goal (issue 37): a progress update within 1 s.

    python benchmarks/progress_lag.py
    python benchmarks/progress_lag.py --updates 40 --interval 0.5
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from loopback_ray import job_server, machine

from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, parse_job_spec

_STAMP = re.compile(rb"(bar|line) (\d+\.\d+)")


def _command(updates: int, interval: float) -> str:
    script = (f"import sys, time\n"
              f"for i in range({updates}):\n"
              f"    sys.stderr.write('\\rbar %.6f' % time.time()); sys.stderr.flush()\n"
              f"    time.sleep({interval / 2})\n"
              f"    print('line %.6f' % time.time(), flush=True)\n"
              f"    time.sleep({interval / 2})\n")
    return f"{sys.executable} -c {shlex.quote(script)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=20, help="updates of each kind (default 20)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between updates")
    args = p.parse_args(argv)
    where = machine()
    lags: dict[bytes, list[float]] = {b"bar": [], b"line": []}
    with tempfile.TemporaryDirectory(prefix="ringtrain-progress-lag-") as tmp:
        home = Home(Path(tmp) / "home")
        with job_server(home, ray_node_ip=None) as client:
            client.create_cluster(ClusterSpec(name="local", nodes=1, slots=1))
            spec = parse_job_spec({"name": "progress-lag", "node_count": 1,
                                   "command": _command(args.updates, args.interval)})
            job = client.submit("local", spec)
            seen = b""
            for chunk in client.logs(job.id, 0, "output", follow=True):
                now = time.time()
                seen += chunk
                # A stamp is complete once something follows it (the next update's \r or \n).
                *complete, seen = re.split(rb"[\r\n]", seen)
                for piece in complete:
                    if m := _STAMP.fullmatch(piece):
                        lags[m[1]].append(now - float(m[2]))
                if m := _STAMP.fullmatch(seen):  # an unfinished bar, as the follower shows it
                    if len(m[2].split(b".")[1]) == 6:
                        lags[m[1]].append(now - float(m[2]))
                        seen = b""
    summary = {kind.decode(): {"median_s": round(statistics.median(v), 3),
                               "max_s": round(max(v), 3), "n": len(v)}
               for kind, v in lags.items() if v}
    print(json.dumps({"benchmark": "progress_lag", "machine": where, **summary,
                      "ratio_bar_to_line": round(statistics.median(lags[b"bar"])
                                                 / statistics.median(lags[b"line"]), 3),
                      "goal": "bar median and max <= 1 s"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
