"""`ringtrain run` over real ssh: a second "host" at 127.0.0.2 served by a test sshd."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

import pytest
from launcher_workers import CONTROLLED, ENV_DUMP, cli, read_pids, run_job, wait_dead, write_script
from sshd import REMOTE_HOST, sshd_server  # noqa: F401 - the fixture is used by name

from ringtrain.runner.plan import compat_shim_dir
from ringtrain.runner.result import RankState

PY = sys.executable

# Two ranks meet in the launcher's store the way `hvd.init()` does: as clients under the run's
# prefix. Rank 1 blocks until rank 0's key arrives.
STORE_WORKER = """
import datetime, os
import torch.distributed as dist
from ringtrain.contract.env import read_worker_env, store_prefix
env = read_worker_env()
assert env.launcher_store
store = dist.PrefixStore(store_prefix(env.run_id, 0), dist.TCPStore(
    env.master_addr, env.master_port, is_master=False,
    timeout=datetime.timedelta(seconds=60)))
if env.rank == 0:
    store.set("greeting", "hello from " + env.hostname)
else:
    with open("greeting.txt", "w") as f:
        f.write(store.get("greeting").decode())
"""


def _via_our_sshd(env: dict, port: int) -> bool:
    return (env["ssh"] or "").split()[2:] == [REMOTE_HOST, str(port)]


def test_two_host_job_remote_env_and_store(tmp_path, sshd_server):  # noqa: F811
    dump = write_script(tmp_path, "dump.py", ENV_DUMP)
    environ = dict(os.environ, RINGTRAIN_TEST_VAR="forwarded")
    result = run_job(["-np", "2", "-H", f"127.0.0.1:1,{REMOTE_HOST}:1",
                      *sshd_server.launcher_flags(), PY, dump], tmp_path, environ)
    assert result.exit_code == 0, result.message
    local, remote = (json.loads((tmp_path / f"env.{r}.json").read_text()) for r in range(2))
    assert not _via_our_sshd(local, sshd_server.port)
    assert _via_our_sshd(remote, sshd_server.port)
    assert (remote["HOROVOD_HOSTNAME"], remote["HOROVOD_RANK"], remote["LOCAL_RANK"],
            remote["LOCAL_WORLD_SIZE"], remote["HOROVOD_CROSS_RANK"],
            remote["HOROVOD_CROSS_SIZE"]) == (REMOTE_HOST, "1", "0", "1", "1", "2")
    assert (local["HOROVOD_HOSTNAME"], local["HOROVOD_CROSS_RANK"]) == ("127.0.0.1", "0")
    for env in (local, remote):
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["GLOO_SOCKET_IFNAME"] == "lo"
        assert env["cwd"] == str(tmp_path)
        assert env["RINGTRAIN_TEST_VAR"] == "forwarded"
        assert env["PATH"] == os.environ["PATH"]
    assert local["MASTER_PORT"] == remote["MASTER_PORT"]
    assert local["RINGTRAIN_RUN_ID"] == remote["RINGTRAIN_RUN_ID"]

    # The same two hosts meet in the launcher's store.
    store = write_script(tmp_path, "store.py", STORE_WORKER)
    result = run_job(["-np", "2", "-H", f"127.0.0.1:1,{REMOTE_HOST}:1",
                      *sshd_server.launcher_flags(), PY, store], tmp_path)
    assert result.exit_code == 0, result.message
    assert (tmp_path / "greeting.txt").read_text() == "hello from 127.0.0.1"


def test_env_contract_localhost_2_and_a_remote_host(tmp_path, sshd_server):  # noqa: F811
    dump = write_script(tmp_path, "dump.py", ENV_DUMP)
    result = run_job(["-np", "3", "-H", f"localhost:2,{REMOTE_HOST}:1",
                      *sshd_server.launcher_flags(), PY, dump], tmp_path)
    assert result.exit_code == 0, result.message
    envs = [json.loads((tmp_path / f"env.{r}.json").read_text()) for r in range(3)]
    assert [_via_our_sshd(e, sshd_server.port) for e in envs] == [False, False, True]
    assert [(e["HOROVOD_HOSTNAME"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"],
             e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) for e in envs] == [
        ("localhost", "0", "2", "0", "2"), ("localhost", "1", "2", "0", "1"),
        (REMOTE_HOST, "0", "1", "1", "2")]


def test_a_local_failure_stops_the_remote_rank(tmp_path, sshd_server):  # noqa: F811
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result = run_job(["-np", "2", "-H", f"localhost:1,{REMOTE_HOST}:1",
                      *sshd_server.launcher_flags(), PY, script, "exit:0:3"], tmp_path)
    assert result.message == "rank 0 on localhost exited with code 3; stopped the other 1 rank"
    assert result.outcomes[1].state is RankState.STOPPED
    assert result.outcomes[1].signal == signal.SIGTERM  # reported by the remote wrapper
    remote_pid = read_pids(tmp_path, 2)[1]
    assert wait_dead([remote_pid], timeout_s=5) == []


def test_a_remote_failure_is_the_root_cause(tmp_path, sshd_server):  # noqa: F811
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result = run_job(["-np", "2", "-H", f"localhost:1,{REMOTE_HOST}:1",
                      *sshd_server.launcher_flags(), PY, script, "kill:1"], tmp_path)
    assert result.exit_code == 1
    assert result.message == (f"rank 1 on {REMOTE_HOST} was killed by signal SIGKILL; "
                              "stopped the other 1 rank")


def test_killing_the_launcher_takes_every_rank_down(tmp_path, sshd_server):  # noqa: F811
    # Even SIGKILL, which the launcher cannot handle: the wrappers see their stdin close.
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    proc = cli(["-np", "2", "-H", f"localhost:1,{REMOTE_HOST}:1",
                *sshd_server.launcher_flags(), PY, script, "sleep"], tmp_path)
    try:
        pids = read_pids(tmp_path, 2)
    finally:
        proc.kill()
        proc.communicate()
    assert wait_dead(pids, timeout_s=10) == []


def test_refused_connection_fails_the_start_with_ssh_s_reason(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind((REMOTE_HOST, 0))
        port = sock.getsockname()[1]
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    result = run_job(["-np", "2", "-H", f"localhost:1,{REMOTE_HOST}:1", "-p", str(port),
                      PY, script, "sleep"], tmp_path)
    assert result.exit_code == 2
    assert result.message.startswith(f"rank 1 on {REMOTE_HOST} did not start: ")
    assert "Connection refused" in result.message
    assert result.message.endswith("; stopped the other 1 rank")


def test_unresponsive_host_hits_the_start_timeout(tmp_path):
    # A listener that never answers: the TCP connection opens, the ssh handshake never comes.
    with socket.socket() as blackhole:
        blackhole.bind((REMOTE_HOST, 0))
        blackhole.listen(8)
        script = write_script(tmp_path, "ctl.py", CONTROLLED)
        result = run_job(["-np", "3", "-H", f"localhost:1,{REMOTE_HOST}:2", "--start-timeout",
                          "2", "-p", str(blackhole.getsockname()[1]), PY, script, "sleep"],
                         tmp_path)
    assert result.exit_code == 2
    # Whichever gives up first: ssh's own ConnectTimeout or the launcher's --start-timeout.
    assert "timed out" in result.message or "--start-timeout" in result.message
    for cause in result.root_causes:
        assert cause.describe().startswith(f"rank {cause.rank} on {REMOTE_HOST} did not start")
    assert sorted(c.rank for c in result.root_causes) == [1, 2]
    assert result.message.endswith("; stopped the other 1 rank")
    assert [o.state for o in result.outcomes] == [
        RankState.STOPPED, RankState.START_FAILED, RankState.START_FAILED]


@pytest.mark.parametrize("flag", ["-i", "-p"])
def test_ssh_flags_are_validated(tmp_path, flag):
    value = "/nonexistent/key" if flag == "-i" else "0"
    proc = cli(["-np", "1", flag, value, PY, "x.py"], tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and flag in err


def test_a_command_missing_remotely_is_a_start_failure(tmp_path, sshd_server):  # noqa: F811
    # No rank is local, so the launcher cannot check the command first; the wrapper reports.
    result = run_job(["-np", "1", "-H", f"{REMOTE_HOST}:1", *sshd_server.launcher_flags(),
                      "no-such-program-xyz"], tmp_path)
    assert result.exit_code == 2
    assert result.message == (f"rank 0 on {REMOTE_HOST} did not start: cannot run "
                              "'no-such-program-xyz': No such file or directory")


# -- one follower per remote host ------------------------------------------------------------

# Prints a line, a partial line and bytes that are no text, so that the relay over ssh must
# carry chunks, not lines of text.
CHATTY = r"""
import os, sys
rank = os.environ["HOROVOD_RANK"]
print("rank", rank, "says hello", flush=True)
sys.stderr.write("rank %s warns\n" % rank)
sys.stderr.flush()
sys.stdout.buffer.write(b"\x00\xff\xfe binary from " + rank.encode() + b"\n")
sys.stdout.buffer.write(b"no newline at the end")
sys.stdout.flush()
"""


def _sessions(server) -> int:
    """How many ssh logins the test sshd accepted so far."""
    return server.log_file.read_text().count("Accepted publickey for")


def _followers_in(directory) -> list[int]:
    """The pids of the followers (`ringtrain run --node-stdio`) that run in ``directory``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            where = os.readlink(f"/proc/{entry}/cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if b"--node-stdio" in argv and b"ringtrain.cli" in argv and where == str(directory):
            found.append(int(entry))
    return found


def test_one_connection_per_host_carries_its_ranks_output_to_the_launcher(tmp_path,
                                                                           sshd_server):  # noqa: F811
    script = write_script(tmp_path, "chatty.py", CHATTY)
    before = _sessions(sshd_server)
    proc = cli(["-np", "4", "-H", f"localhost:1,{REMOTE_HOST}:3", "--output-filename", "out",
                *sshd_server.launcher_flags(), PY, script], tmp_path, errors="replace")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert _sessions(sshd_server) - before == 1  # three remote ranks, one ssh login
    for rank in range(4):
        # The launcher printed every rank's lines with its prefix, partial line included...
        assert f"[{rank}]<stdout>:rank {rank} says hello\n" in out
        assert f"[{rank}]<stderr>:rank {rank} warns\n" in err
        assert f"[{rank}]<stdout>:no newline at the end\n" in out
        # ...and wrote the files here, byte for byte as the rank printed them.
        files = tmp_path / "out" / f"rank.{rank}"
        assert (files / "stdout").read_bytes() == (
            f"rank {rank} says hello\n".encode() + b"\x00\xff\xfe binary from "
            + str(rank).encode() + b"\nno newline at the end")
        assert (files / "stderr").read_bytes() == f"rank {rank} warns\n".encode()
    assert not _followers_in(tmp_path)  # the follower ended with the job


def test_killing_the_launcher_stops_the_follower_and_its_ranks(tmp_path, sshd_server):  # noqa: F811
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    proc = cli(["-np", "3", "-H", f"localhost:1,{REMOTE_HOST}:2",
                *sshd_server.launcher_flags(), PY, script, "sleep"], tmp_path)
    try:
        pids = read_pids(tmp_path, 3)
        followers = _followers_in(tmp_path)
    finally:
        proc.kill()  # SIGKILL: the launcher says nothing; its ssh connection closes
        proc.communicate()
    assert len(followers) == 1
    assert wait_dead([*pids, *followers], timeout_s=20) == []


ELASTIC_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_train.py")


@pytest.mark.slow
def test_an_elastic_world_re_forms_without_a_worker_killed_on_a_remote_host(tmp_path,
                                                                            sshd_server):  # noqa: F811
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    environ |= {"OMP_NUM_THREADS": "1", "RINGTRAIN_TEST_PAUSE": "2:0:6"}
    proc = cli(["-np", "3", "--min-np", "2", "--max-np", "3", "-H",
                f"localhost:2,{REMOTE_HOST}:1", "--elastic-timeout", "60",
                *sshd_server.launcher_flags(), PY, ELASTIC_SCRIPT], tmp_path, env=environ)
    events = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # worker 2's lines come over the follower's connection
            _, sep, text = line.partition("]<stdout>:")
            if sep and text.startswith("{"):
                events.append(json.loads(text))
                if events[-1]["event"] == "pause":
                    start = next(e for e in events
                                 if e["event"] == "start" and e["worker"] == 2)
                    os.kill(start["pid"], signal.SIGKILL)
                    break
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert events and events[-1]["event"] == "pause" and events[-1]["worker"] == 2
    assert proc.returncode == 0, err
    assert (f"worker 2 on {REMOTE_HOST} was killed by signal SIGKILL; re-forming the world "
            "without it") in err
    assert not _followers_in(tmp_path)


def test_horovod_compat_puts_each_host_s_shim_first_once(tmp_path, sshd_server):  # noqa: F811
    # The follower adds the shim of its own host's ringtrain before the PYTHONPATH it was
    # given; the launcher adds nothing of its machine's for remote ranks.
    probe = ("import os, horovod; print('shim', horovod.__file__); "
             "print('path', os.environ['PYTHONPATH'])")
    given = [str(tmp_path / "mine"), *filter(None, os.environ.get("PYTHONPATH", "").split(
        os.pathsep))]
    proc = cli(["-np", "2", "-H", f"localhost:1,{REMOTE_HOST}:1", "--horovod-compat",
                *sshd_server.launcher_flags(), PY, "-c", probe], tmp_path,
               env=dict(os.environ, PYTHONPATH=os.pathsep.join(given)))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    shim = compat_shim_dir()
    for rank in range(2):
        assert f"[{rank}]<stdout>:shim {shim}/horovod/__init__.py" in out
        path = next(line.split("path ", 1)[1] for line in out.splitlines()
                    if line.startswith(f"[{rank}]<stdout>:path "))
        assert path.split(os.pathsep) == [shim, *given]
