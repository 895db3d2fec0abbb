"""`ringtrain run` in its per-node mode: one real `ringtrain run` process per node on this
machine, node 0 serving the rendezvous on loopback; real ranks on Gloo.

Covers the fixed world (the ranks' places, every node's output files, node 0's result file),
a failing rank on a follower named as the root cause by node 0, a follower whose machine dies
(its beat stops), a follower whose node 0 dies, one that never finds node 0, and an elastic
world that re-forms without a killed node.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
ELASTIC_SCRIPT = Path(__file__).resolve().parent / "elastic_train.py"
ALLREDUCE = ("import os, sys, time, torch, ringtrain.torch as hvd; hvd.init(); "
             "s = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum); "
             "print('sum', int(s.item()), 'rank', hvd.rank(), 'of', hvd.size(), "
             "os.environ['HOROVOD_HOSTNAME'], flush=True); "
             "code = int(os.environ.get('FAIL_RANK_' + str(hvd.rank()), 0)); "
             "time.sleep(float(os.environ.get('SLEEP', 0)) if not code else 0); sys.exit(code)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(k: int, nnodes: int, port: int, tmp: Path, *extra: str, command: list[str],
          env: dict[str, str] | None = None) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    environ |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    argv = [sys.executable, "-m", "ringtrain.cli", "run", "--nnodes", str(nnodes),
            "--node-rank", str(k), "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--output-filename", str(tmp / "out"), *extra, *command]
    return subprocess.Popen(argv, cwd=tmp, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout_s: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"a node did not end within {timeout_s} s:\n{out}\n{err}")
    return proc.returncode, out, err


def test_two_nodes_form_one_world_and_node_0_writes_the_result(tmp_path: Path) -> None:
    port = _port()
    command = [sys.executable, "-c", ALLREDUCE]
    follower = _node(1, 2, port, tmp_path, "--nproc-per-node", "2", command=command)
    driver = _node(0, 2, port, tmp_path, "--nproc-per-node", "2", "--result-file",
                   str(tmp_path / "result.json"), command=command)
    rc0, out0, err0 = _finish(driver)
    rc1, out1, err1 = _finish(follower)
    assert (rc0, rc1) == (0, 0), err0 + err1
    # Node 0's ranks print through node 0, node 1's through node 1, each with its rank prefix.
    assert "[0]<stdout>:sum 10 rank 0 of 4 node0" in out0
    assert "[3]<stdout>:sum 10 rank 3 of 4 node1" in out1
    for rank, host in ((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")):
        stdout = (tmp_path / "out" / f"rank.{rank}" / "stdout").read_text()
        assert stdout == f"sum 10 rank {rank} of 4 {host}\n"
        # The interleaved file `job logs --follow` reads is written on every node.
        assert stdout in (tmp_path / "out" / f"rank.{rank}" / "output").read_text()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"exit_code": 0, "message": "all 4 ranks succeeded", "root_causes": []}


def test_a_rank_failing_on_a_follower_is_node_0s_root_cause(tmp_path: Path) -> None:
    port = _port()
    command = [sys.executable, "-c", ALLREDUCE]
    env = {"FAIL_RANK_1": "7", "SLEEP": "60"}
    follower = _node(1, 2, port, tmp_path, command=command, env=env)
    driver = _node(0, 2, port, tmp_path, "--result-file", str(tmp_path / "result.json"),
                   command=command, env=env)
    rc0, _, err0 = _finish(driver)
    rc1, _, err1 = _finish(follower)
    assert rc0 == 1 and "rank 1 on node1 exited with code 7; stopped the other 1 rank" in err0
    assert rc1 == 0, err1  # it did its part; node 0's result is the job's
    assert "the job failed with exit status 1" in err1
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["root_causes"] == [{"rank": 1, "hostname": "node1", "state": "failed",
                                      "exit_code": 7, "signal": None}]


def test_a_follower_that_dies_is_named_by_node_0(tmp_path: Path) -> None:
    port = _port()
    command = [sys.executable, "-c", ALLREDUCE]
    env = {"SLEEP": "120"}
    # A lost node is named after --node-timeout without a beat (every 0.5 s): 4 s, not 10.
    follower = _node(1, 2, port, tmp_path, "--node-timeout", "4", command=command, env=env)
    driver = _node(0, 2, port, tmp_path, "--node-timeout", "4", command=command, env=env)
    rank1 = tmp_path / "out" / "rank.1" / "output"
    wait_until(lambda: _running_or_fail(driver) and rank1.exists() and rank1.read_text(),
               "rank 1's output", timeout_s=90)
    os.killpg(follower.pid, signal.SIGKILL)  # its machine is gone: no last word to node 0
    rc0, _, err0 = _finish(driver)
    assert rc0 == 1
    assert "rank 1 on node1 failed: node 1 (node1) stopped answering" in err0, err0
    follower.communicate()


def test_a_follower_stops_its_ranks_when_node_0_dies(tmp_path: Path) -> None:
    port = _port()
    marker = f"ringtrain-node-orphan-{os.getpid()}"
    command = [sys.executable, "-c", "import time, sys; time.sleep(120)", marker]
    follower = _node(1, 2, port, tmp_path, command=command)
    driver = _node(0, 2, port, tmp_path, command=command)
    wait_until(lambda: _running_or_fail(follower) and len(_running(marker)) >= 2,
               "both ranks running (and both launchers)", timeout_s=90)
    os.killpg(driver.pid, signal.SIGKILL)  # node 0 and its rank; the store goes with it
    rc1, _, err1 = _finish(follower, timeout_s=60)
    assert rc1 == 1 and "node 1: lost the driver's store" in err1, err1
    # node 0's rank ends too: its wrapper lost its launcher
    wait_until(lambda: not _running(marker), "the end of node 0's rank", timeout_s=30)
    driver.communicate()


def test_a_follower_without_node_0_gives_up_after_the_rendezvous_timeout(tmp_path: Path) -> None:
    follower = _node(1, 2, _port(), tmp_path, "--rdzv-timeout", "2", command=["true"])
    rc, _, err = _finish(follower, timeout_s=60)
    assert rc == 2 and "the driver (node 0) did not answer at 127.0.0.1:" in err, err
    assert "within 2 s (--rdzv-timeout)" in err


def _running_or_fail(node: subprocess.Popen) -> bool:
    """True while ``node``'s launcher runs; fails the test once it has ended."""
    assert node.poll() is None, f"the launcher ended early: {node.communicate()}"
    return True


def _running(marker: str) -> list[int]:
    """The rank processes (``python -c ... MARKER``) alive now, launchers excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv and argv[1:2] == [b"-c"]:
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_an_elastic_world_re_forms_without_a_killed_node(tmp_path: Path) -> None:
    port = _port()
    command = [sys.executable, str(ELASTIC_SCRIPT)]
    # Node 2's loss is known after --node-timeout without a beat (every 0.5 s): 4 s, not 10.
    flags = ("--min-np", "2", "--max-np", "3", "--elastic-timeout", "60", "--node-timeout", "4")
    env = {"RINGTRAIN_TEST_PAUSE": "2:0:6"}
    nodes = [_node(k, 3, port, tmp_path, *flags, command=command, env=env) for k in (1, 2)]
    driver = _node(0, 3, port, tmp_path, *flags, command=command, env=env)
    events = tmp_path / "out" / "rank.2" / "stdout"
    wait_until(lambda: _running_or_fail(driver)
               and '"pause"' in (events.read_text() if events.exists() else ""),
               "worker 2's pause", timeout_s=120)
    start = next(json.loads(line) for line in events.read_text().splitlines()
                 if '"start"' in line)
    os.killpg(nodes[1].pid, signal.SIGKILL)  # node 2's `ringtrain run`...
    os.kill(start["pid"], signal.SIGKILL)  # ...and its rank, as a machine loss takes both
    rc0, _, err0 = _finish(driver, timeout_s=180)
    rc1, _, err1 = _finish(nodes[0])
    assert rc0 == 0, err0
    assert rc1 == 0, err1
    survivor = [json.loads(line) for line in
                (tmp_path / "out" / "rank.0" / "stdout").read_text().splitlines()
                if line.startswith("{")]
    assert any(e["event"] == "batch" and e["size"] == 2 for e in survivor)
    assert [e["epoch"] for e in survivor if e["event"] == "epoch"] == [0, 1, 2, 3]
    nodes[1].communicate()
