"""hvd.init() never hangs on a rank that does not come: it waits in slices (a signal handler
interrupts it) and gives up after the start timeout naming the missing rank. One real process
of a two-rank world, whose rank 1 never starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.multiproc.world import free_port

_SCRIPT = """
import json, signal, time
import ringtrain.torch as hvd

class Interrupted(Exception):
    pass

def handler(signum, frame):
    raise Interrupted

out = {}
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.5)
try:
    hvd.init()
    out["interrupted"] = "no"
except Interrupted:
    out["interrupted"] = "yes"
finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
try:
    hvd.init()
    out["init"] = "no error"
except RuntimeError as exc:
    out["init"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def test_init_waits_interruptibly_for_a_rank_that_never_comes_then_names_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    env |= {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
            "HOROVOD_START_TIMEOUT": "3", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["interrupted"] == "yes"
    assert out["init"].startswith("HorovodInternalError: rank(s) [1] did not call hvd.init() "
                                  "within 3 s of rank 0 (the start timeout"), out
