"""Launch planning: each rank's environment, local or remote (pure)."""

from __future__ import annotations

import os
import shlex

from ringtrain.contract.env import read_worker_env, remote_environ
from ringtrain.runner.config import load_config
from ringtrain.runner.plan import build_plan, compat_shim_dir, used_hostnames
from ringtrain.runner.rendezvous import NetworkPlan
from ringtrain.runner.spawn import SpawnOptions, ssh_argv, task_argv

LAUNCHER_ENV = {
    "PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/src", "VIRTUAL_ENV": "/venv", "MY_FLAG": "on",
    "HOSTNAME": "launcher", "SSH_AUTH_SOCK": "/tmp/agent", "PWD": "/home/u", "RANK": "7",
    "BASH_FUNC_f%%": "() { :; }",
}


def plan_for(*argv: str, net: NetworkPlan | None = None, environ=LAUNCHER_ENV):
    config = load_config(list(argv), {})
    net = net or NetworkPlan("127.0.0.1", ("lo",), False, frozenset({"localhost"}))
    return build_plan(config, net, 4242, "run1", environ)


def test_contract_per_rank_and_read_back_by_the_worker_side():
    net = NetworkPlan("127.0.0.1", ("lo",), False, frozenset({"localhost"}))
    plan = plan_for("-np", "3", "-H", "localhost:2,127.0.0.2:1", "--cycle-time-ms", "5",
                    "python", "t.py", net=net)
    assert [(r.rank, r.hostname, r.local) for r in plan.ranks] == [
        (0, "localhost", True), (1, "localhost", True), (2, "127.0.0.2", False)]
    envs = [read_worker_env(r.env) for r in plan.ranks]
    assert [(e.rank, e.size, e.local_rank, e.local_size, e.cross_rank, e.cross_size)
            for e in envs] == [(0, 3, 0, 2, 0, 2), (1, 3, 1, 2, 0, 1), (2, 3, 0, 1, 1, 2)]
    for e in envs:
        assert (e.launcher, e.master_addr, e.master_port, e.run_id) == (
            "ringtrain", "127.0.0.1", 4242, "run1")
        assert e.launcher_store and e.knobs.cycle_time_ms == 5.0
    assert envs[2].hostname == "127.0.0.2"
    assert plan.ranks[0].env["LOCAL_WORLD_SIZE"] == "2" and plan.ranks[2].env["GROUP_RANK"] == "1"


def test_local_ranks_inherit_everything_but_the_contract_wins():
    env = plan_for("-np", "1", "x").ranks[0].env
    assert env["HOSTNAME"] == "launcher" and env["MY_FLAG"] == "on"
    assert env["RANK"] == "0"  # the launcher's own RANK=7 is replaced
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"


def test_remote_ranks_get_the_portable_part_of_the_environment():
    net = NetworkPlan("10.0.0.1", (), False, frozenset())
    env = plan_for("-np", "1", "-H", "node2:1", "x", net=net).ranks[0].env
    for kept in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "MY_FLAG"):
        assert env[kept] == LAUNCHER_ENV[kept]
    for dropped in ("HOSTNAME", "SSH_AUTH_SOCK", "PWD", "BASH_FUNC_f%%"):
        assert dropped not in env
    assert env["MASTER_ADDR"] == "10.0.0.1"
    assert "GLOO_SOCKET_IFNAME" not in env


def test_remote_environ_filter():
    assert remote_environ({"A": "1", "HOST": "x", "SSH_TTY": "t", "_": "/bin/ls", "1X": "y",
                           "XDG_SESSION_ID": "3", "XDG_DATA_DIRS": "/d"}) == {
        "A": "1", "XDG_DATA_DIRS": "/d"}


def test_user_socket_ifname_wins_over_derived_loopback_but_not_over_the_flag():
    environ = {"GLOO_SOCKET_IFNAME": "eth9"}
    derived = NetworkPlan("127.0.0.1", ("lo",), False, frozenset({"localhost"}))
    env = plan_for("-np", "1", "x", net=derived, environ=environ).ranks[0].env
    assert env["GLOO_SOCKET_IFNAME"] == "eth9" and env["NCCL_SOCKET_IFNAME"] == "lo"
    explicit = NetworkPlan("10.1.1.1", ("eth0",), True, frozenset({"localhost"}))
    env = plan_for("-np", "1", "x", net=explicit, environ=environ).ranks[0].env
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_user_pythonunbuffered_is_kept():
    env = plan_for("-np", "1", "x", environ={"PYTHONUNBUFFERED": ""}).ranks[0].env
    assert env["PYTHONUNBUFFERED"] == ""


def test_horovod_compat_prepends_the_shim_to_pythonpath():
    env = plan_for("-np", "1", "--horovod-compat", "x").ranks[0].env
    assert env["PYTHONPATH"] == compat_shim_dir() + os.pathsep + "/src"
    assert compat_shim_dir().endswith(os.path.join("ringtrain", "compat", "shim"))
    assert plan_for("-np", "1", "x").ranks[0].env["PYTHONPATH"] == "/src"


def test_used_hostnames_skips_hosts_without_ranks():
    config = load_config(["-np", "2", "-H", "a:1,b:1,c:4", "x"], {})
    assert used_hostnames(config) == ["a", "b"]


def test_ssh_command_line():
    options = SpawnOptions(python="/venv/bin/python", cwd="/work dir", token="tok", grace_s=3.0,
                           connect_timeout_s=7.5, ssh_port=2222, ssh_identity_file="/k/id")
    argv = ssh_argv("node2", options, {"A": "x y", "B": "$HOME"}, ["python", "t.py", "--n", "1"])
    assert argv[:2] == ["ssh", "-T"]
    opts = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-o")
    assert opts == {"BatchMode": "yes", "StrictHostKeyChecking": "no",
                    "UserKnownHostsFile": "/dev/null", "LogLevel": "ERROR",
                    "ConnectTimeout": "8"}
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/k/id"
    assert argv[-2] == "node2"
    assert shlex.split(argv[-1]) == [
        "cd", "/work dir", "&&", "env", "A=x y", "B=$HOME", "/venv/bin/python", "-m",
        "ringtrain.runner.task", "--token", "tok", "--grace", "3", "--", "python", "t.py",
        "--n", "1"]
    assert task_argv(options, ["x"])[-2:] == ["--", "x"]
