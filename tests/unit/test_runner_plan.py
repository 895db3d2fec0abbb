"""Launch planning: each rank's environment, local or remote (pure)."""

from __future__ import annotations

import os
import shlex

from ringtrain.contract.env import read_worker_env, remote_environ
from ringtrain.runner.config import load_config
from ringtrain.runner.plan import build_plan, compat_shim_dir, used_hostnames
from ringtrain.runner.rendezvous import NetworkPlan
from ringtrain.runner.spawn import SpawnOptions, task_argv
from ringtrain.runner.ssh_nodes import FollowerLaunch, follower_argv

LAUNCHER_ENV = {
    "PATH": "/venv/bin:/usr/bin", "PYTHONPATH": "/src", "VIRTUAL_ENV": "/venv", "MY_FLAG": "on",
    "HOSTNAME": "launcher", "SSH_AUTH_SOCK": "/tmp/agent", "PWD": "/home/u", "RANK": "7",
    "BASH_FUNC_f%%": "() { :; }",
}


def plan_for(*argv: str, net: NetworkPlan | None = None, environ=LAUNCHER_ENV):
    """The plan of a launch whose hosts not in ``net.local_hosts`` are node 1's."""
    config = load_config(list(argv), {})
    plan_net = net or NetworkPlan("127.0.0.1", ("lo",), False, frozenset({"localhost"}))
    return build_plan(config, plan_net, 4242, "run1", environ,
                      lambda slot: None if slot.hostname in plan_net.local_hosts else 1)


def test_contract_per_rank_and_read_back_by_the_worker_side():
    net = NetworkPlan("127.0.0.1", ("lo",), False, frozenset({"localhost"}))
    plan = plan_for("-np", "3", "-H", "localhost:2,127.0.0.2:1", "--cycle-time-ms", "5",
                    "python", "t.py", net=net)
    assert [(r.rank, r.hostname, r.node) for r in plan.ranks] == [
        (0, "localhost", None), (1, "localhost", None), (2, "127.0.0.2", 1)]
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


def test_a_rank_of_another_node_gets_only_what_goes_on_top_of_its_follower_s_environment():
    net = NetworkPlan("10.0.0.1", (), False, frozenset())
    env = plan_for("-np", "1", "-H", "node2:1", "--horovod-compat", "x", net=net).ranks[0].env
    for own in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "MY_FLAG", "HOSTNAME"):
        assert own not in env  # the follower's (for ssh: the forwarded part of the launcher's)
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["RANK"] == "0"
    assert env["PYTHONUNBUFFERED"] == "1"
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


def test_the_follower_s_ssh_command_line(tmp_path):
    key = tmp_path / "id"
    key.write_text("")
    config = load_config(["-np", "3", "-H", "localhost:1,node2:2", "-p", "2222", "-i", str(key),
                          "--start-timeout", "7.5", "--horovod-compat", "--output-filename",
                          str(tmp_path / "out"), "--", "python", "t.py", "--n", "1"], {})
    launch = FollowerLaunch(config, "/venv/bin/python", "/work dir",
                            {"A": "x y", "B": "$HOME", "SSH_AUTH_SOCK": "/a", "HOSTNAME": "l"},
                            "10.0.0.1:4242")
    argv = follower_argv(launch, 1, 2, "node2", 2)
    assert argv[:2] == ["ssh", "-T"]
    opts = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-o")
    assert opts == {"BatchMode": "yes", "StrictHostKeyChecking": "no",
                    "UserKnownHostsFile": "/dev/null", "LogLevel": "ERROR",
                    "ConnectTimeout": "8"}
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == str(key)
    assert argv[-2] == "node2"
    remote = shlex.split(argv[-1])
    # Only the portable part of the launcher's environment goes along.
    assert remote[:7] == ["cd", "/work dir", "&&", "env", "A=x y", "B=$HOME",
                          "/venv/bin/python"]
    assert remote[7:10] == ["-m", "ringtrain.cli", "run"]
    # What the follower runs is `ringtrain run` in its per-node mode, which it parses as such;
    # the output options stay with the launcher, which writes the files.
    follower = load_config(remote[10:], {})
    assert follower.node is not None
    assert (follower.node.node_rank, follower.node.nproc_per_node, follower.node.name,
            follower.node.endpoint_host, follower.node.endpoint_port, follower.node.stdio) == (
        1, 2, "node2", "10.0.0.1", 4242, True)
    assert follower.horovod_compat and follower.start_timeout_s == 7.5
    assert follower.output_filename is None
    assert follower.command == ("python", "t.py", "--n", "1")


def test_task_command_line():
    options = SpawnOptions(python="/venv/bin/python", cwd="/work dir", token="tok", grace_s=3.0)
    assert task_argv(options, ["python", "t.py"]) == [
        "/venv/bin/python", "-m", "ringtrain.runner.task", "--token", "tok", "--grace", "3",
        "--", "python", "t.py"]
