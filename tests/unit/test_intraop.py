"""The engine's thread runs tensor kernels without an OpenMP team of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

_SCRIPT = textwrap.dedent("""
    import os, threading, torch
    import ringtrain.torch as hvd
    from ringtrain.engine.intraop import serialize_this_thread

    torch.set_num_threads(2)
    seen = {}
    def limited():
        seen["limited"] = serialize_this_thread()
        seen["threads"] = torch.get_num_threads()
    t = threading.Thread(target=limited)
    t.start()
    t.join()
    print("thread", seen["limited"], seen["threads"], "main", torch.get_num_threads())

    hvd.init()  # a world of one: the same engine thread, a local backend
    big = torch.randn(4_000_000)
    big.mul_(2.0)  # the training thread's team exists from here on
    before = len(os.listdir("/proc/self/task"))
    parts = [torch.ones(500_000) for _ in range(3)]  # fused: copied by the engine thread
    hvd.grouped_allreduce_(parts, op=hvd.Sum, name="fused")
    print("tasks", before, len(os.listdir("/proc/self/task")), flush=True)
    hvd.shutdown()
    # What is measured is printed; a rare abort in interpreter teardown under heavy load
    # ("terminate called without an active exception") is not this test's subject.
    os._exit(0)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
@pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(),
                    reason="this PyTorch has no OpenMP teams")
def test_the_engine_thread_starts_no_team_and_leaves_the_callers_threads_alone():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    # the limited thread runs serially; the process default stays the user's
    assert lines["thread"] == "True 1 main 2"
    before, after = lines["tasks"].split()
    # an engine thread with a team of its own would have added OpenMP workers
    assert before == after, out.stdout
