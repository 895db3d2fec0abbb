"""`ringtrain run` with real local processes: the env contract, output, failures, signals."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading

import pytest
from launcher_workers import (
    CONTROLLED,
    ENV_DUMP,
    cli,
    is_alive,
    read_pids,
    run_job,
    running,
    wait_dead,
    write_script,
)

from ringtrain.runner.result import RankState
from tests.waiting import wait_until

PY = sys.executable


def test_env_contract_on_two_host_names(tmp_path):
    # localhost and this machine's own name are two hosts to the assignment, both local.
    other = socket.gethostname()
    assert other != "localhost"
    script = write_script(tmp_path, "dump.py", ENV_DUMP)
    cfg = tmp_path / "run.yaml"
    cfg.write_text("fusion-threshold-mb: 32\ncycle_time_ms: 2\n"
                   "timeline:\n  filename: tl.json\n  mark_cycles: true\n")
    environ = dict(os.environ, RINGTRAIN_TEST_VAR="forwarded")
    result = run_job(["-np", "3", "-H", f"localhost:2,{other}:1", "--config-file", str(cfg),
                      "--cycle-time-ms", "5", "--no-stall-check", PY, script, "--flag"],
                     tmp_path, environ)
    assert result.exit_code == 0, result.message
    assert [o.state for o in result.outcomes] == [RankState.SUCCEEDED] * 3
    envs = [json.loads((tmp_path / f"env.{r}.json").read_text()) for r in range(3)]
    expected = [  # rank, local rank/size, cross rank/size, hostname
        ("0", "0", "2", "0", "2", "localhost"), ("1", "1", "2", "0", "1", "localhost"),
        ("2", "0", "1", "1", "2", other)]
    for env, (rank, lrank, lsize, xrank, xsize, host) in zip(envs, expected):
        assert (env["HOROVOD_RANK"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"],
                env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"], env["HOROVOD_HOSTNAME"]
                ) == (rank, lrank, lsize, xrank, xsize, host)
        assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == (
            rank, lrank, lsize, xrank)
        assert env["HOROVOD_SIZE"] == env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["RINGTRAIN_LAUNCHER_STORE"] == "1"
        assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["PYTHONUNBUFFERED"] == "1"
        assert env["HOROVOD_START_TIMEOUT"] == "30"
        assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
        assert env["HOROVOD_CYCLE_TIME"] == "5"  # the command line beats the file's 2
        assert env["HOROVOD_TIMELINE"] == "tl.json"
        assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
        assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"
        assert env["RINGTRAIN_TEST_VAR"] == "forwarded"
        assert env["cwd"] == str(tmp_path) and env["argv"] == ["--flag"]
    assert len({(e["MASTER_PORT"], e["RINGTRAIN_RUN_ID"]) for e in envs}) == 1


def test_output_is_prefixed_and_written_per_rank(tmp_path, capfd):
    script = write_script(tmp_path, "talk.py", (
        "import os, sys\n"
        "r = os.environ['RANK']\n"
        "print('out', r, 'line 1'); print('out', r, 'line 2')\n"
        "sys.stderr.write('err ' + r + ' no newline')\n"))
    out_dir = tmp_path / "logs"
    result = run_job(["-np", "2", "--output-filename", str(out_dir), PY, script], tmp_path)
    assert result.exit_code == 0, result.message
    captured = capfd.readouterr()
    for r in range(2):
        # ranks print concurrently: only each rank's own lines have an order
        mine = [line for line in captured.out.splitlines() if line.startswith(f"[{r}]")]
        assert mine == [f"[{r}]<stdout>:out {r} line 1", f"[{r}]<stdout>:out {r} line 2"]
        assert f"[{r}]<stderr>:err {r} no newline\n" in captured.err
        assert (out_dir / f"rank.{r}" / "stdout").read_text() == (
            f"out {r} line 1\nout {r} line 2\n")
        # The wrapper's exit marker follows the unfinished line, which thereby ends.
        assert (out_dir / f"rank.{r}" / "stderr").read_text() == f"err {r} no newline\n"
    assert "@ringtrain-task" not in captured.out + captured.err


def test_rank_files_are_flushed_line_by_line(tmp_path):
    # The rank prints a line, then runs until the test has found it in its file.
    stop = tmp_path / "stop"
    script = write_script(tmp_path, "slow.py", (
        "import os, time\n"
        "print('a line')\n"  # no flush: the launcher makes workers line-buffered
        "deadline = time.time() + 120\n"
        f"while not os.path.exists({str(stop)!r}) and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"))
    out = tmp_path / "logs" / "rank.0" / "stdout"
    thread = threading.Thread(target=run_job, args=(
        ["-np", "1", "--output-filename", str(tmp_path / "logs"), PY, script], tmp_path))
    thread.start()
    try:
        wait_until(lambda: out.exists() and out.read_text() == "a line\n",
                   "the line in the rank's file while the rank runs")
        assert thread.is_alive()  # the rank still runs: its exit flushed nothing
    finally:
        stop.touch()
        thread.join()


def test_a_progress_bar_reaches_the_rank_files_while_its_line_is_unfinished(tmp_path):
    # tqdm redraws its line with "\r" and never ends it while it runs.
    stop = tmp_path / "stop"
    script = write_script(tmp_path, "bar.py", (
        "import os, time\n"
        "from tqdm import tqdm\n"
        "with tqdm(total=1000, desc='train', mininterval=0) as bar:\n"
        "    for _ in range(600):\n"
        f"        if os.path.exists({str(stop)!r}):\n"
        "            break\n"
        "        bar.update(1)\n"
        "        time.sleep(0.1)\n"))
    log = tmp_path / "logs" / "rank.0" / "stderr"
    thread = threading.Thread(target=run_job, args=(
        ["-np", "1", "--output-filename", str(tmp_path / "logs"), PY, script], tmp_path))
    thread.start()
    try:
        wait_until(lambda: log.exists() and b"train:" in log.read_bytes()
                   and b"5/1000" in log.read_bytes(), "a progress update in the rank's file")
        assert b"\n" not in log.read_bytes()  # the bar's line was still unfinished
    finally:
        stop.touch()
        thread.join()


def test_a_rank_that_calls_init_late_causes_no_c10d_warnings(tmp_path):
    # Rank 0 waits for its peers in init(); a store wait that times out makes c10d print
    # "socket.cpp ... waitForInput ... timed out" on every rank that waits.
    script = write_script(tmp_path, "late.py", (
        "import os, time\n"
        "import torch\n"
        "import ringtrain.torch as hvd\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(1.5)\n"
        "hvd.init()\n"
        "print('sum', hvd.allreduce(torch.ones(1), op=hvd.Sum).item())\n"))
    out_dir = tmp_path / "logs"
    result = run_job(["-np", "2", "--output-filename", str(out_dir), PY, script], tmp_path)
    assert result.exit_code == 0, result.message
    for r in range(2):
        assert "sum 2.0" in (out_dir / f"rank.{r}" / "stdout").read_text()
        stderr = (out_dir / f"rank.{r}" / "stderr").read_text()
        assert "socket.cpp" not in stderr and "c10d" not in stderr, stderr


def test_first_failure_stops_the_others_quickly(tmp_path):
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result = run_job(["-np", "3", PY, script, "exit:1:3"], tmp_path)
    assert result.exit_code == 1
    assert result.message == "rank 1 on localhost exited with code 3; stopped the other 2 ranks"
    # Stopped, not left to end their two minutes (how soon: benchmarks/failure_latency.py).
    assert [o.state for o in result.outcomes] == [
        RankState.STOPPED, RankState.FAILED, RankState.STOPPED]
    assert running(read_pids(tmp_path, 3)) == []


def test_a_signal_is_named(tmp_path):
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result = run_job(["-np", "2", PY, script, "kill:0"], tmp_path)
    assert result.exit_code == 1
    assert result.message == ("rank 0 on localhost was killed by signal SIGKILL; "
                              "stopped the other 1 rank")
    assert result.root_causes[0].signal == signal.SIGKILL


def test_a_rank_that_ignores_sigterm_is_killed(tmp_path):
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result = run_job(["-np", "2", PY, script, "deaf:0:1"], tmp_path)
    assert result.message == "rank 0 on localhost exited with code 1; stopped the other 1 rank"
    assert result.outcomes[1].state is RankState.STOPPED
    assert result.outcomes[1].signal == signal.SIGKILL  # after the wrapper's grace period
    assert running(read_pids(tmp_path, 2)) == []


@pytest.mark.parametrize("argv, message", [
    (["-np", "2", PY, "missing.py"], "missing.py: no such file"),
    (["-np", "2", "no-such-program-xyz"], "command 'no-such-program-xyz' is not on PATH"),
    (["-np", "0", PY, "x.py"], "-np/--num-proc: 0 ranks requested; give at least 1"),
    (["-np", "3", "-H", "localhost:2", PY, "x.py"], "have only 2 slots"),
    (["-np", "1", "-H", "localhost:x", PY, "x.py"], "-H/--hosts entry 'localhost:x'"),
    (["-np", "2"], "no command given"),
    (["-np", "2", "--mpi", PY, "x.py"], "--mpi: ringtrain has no MPI"),
])
def test_cli_rejects_bad_input_with_exit_2(tmp_path, argv, message):
    proc = cli(argv, tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.startswith("ringtrain run: ") and message in err
    assert out == ""


def test_cli_reports_the_root_cause_and_exits_1(tmp_path):
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result_file = tmp_path / "result.json"
    proc = cli(["-np", "2", "--result-file", str(result_file), PY, script, "exit:1:3"], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert err.splitlines()[-1] == (
        "ringtrain run: rank 1 on localhost exited with code 3; stopped the other 1 rank")
    assert "[0]<stdout>:rank 0 ready" in out and "[1]<stdout>:rank 1 ready" in out
    assert json.loads(result_file.read_text()) == {
        "exit_code": 1,
        "message": "rank 1 on localhost exited with code 3; stopped the other 1 rank",
        "root_causes": [{"rank": 1, "hostname": "localhost", "state": "failed", "exit_code": 3,
                         "signal": None}]}


def test_cli_ctrl_c_stops_every_rank(tmp_path):
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    proc = cli(["-np", "2", PY, script, "sleep"], tmp_path)
    try:
        pids = read_pids(tmp_path, 2)  # both commands run: their wrappers reported in
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT
    assert err.splitlines()[-1] == "ringtrain run: interrupted by signal SIGINT; stopped 2 ranks"
    assert wait_dead(pids, timeout_s=2) == []
    assert not any(is_alive(p) for p in pids)
