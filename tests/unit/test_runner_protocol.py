"""The task wrapper's marker protocol, command checks, network questions and result messages."""

from __future__ import annotations

import signal
import socket
import sys

import pytest

from ringtrain.errors import ConfigError
from ringtrain.runner import network
from ringtrain.runner.preflight import check_command, python_script
from ringtrain.runner.rendezvous import NetworkPlan, plan_network
from ringtrain.runner.result import (
    RankOutcome,
    RankState,
    RunResult,
    TransitionError,
    check_transition,
)
from ringtrain.runner.task import Marker, MarkerEvent, format_marker, split_marker

EXIT, STARTED = MarkerEvent.EXIT, MarkerEvent.STARTED


def test_marker_round_trip():
    line = format_marker("abc", EXIT, "signal=9")
    assert line == b"@ringtrain-task:abc:exit signal=9\n"
    assert split_marker("abc", line) == (b"", Marker(EXIT, "signal=9"))
    assert Marker(EXIT, "signal=9").exit_status() == (None, 9)
    assert Marker(EXIT, "code=3").exit_status() == (3, None)
    assert Marker(STARTED, "4242").pid == 4242


def test_marker_after_a_partial_line_and_foreign_tokens():
    assert split_marker("abc", b"50%@ringtrain-task:abc:started 12\n") == (
        b"50%", Marker(STARTED, "12"))
    assert split_marker("abc", b"@ringtrain-task:xyz:exit code=0\n") == (
        b"@ringtrain-task:xyz:exit code=0\n", None)
    assert split_marker("abc", b"plain\n") == (b"plain\n", None)


@pytest.mark.parametrize("line, why", [
    (b"@ringtrain-task:abc:exited code=0\n", "'exited' is not a valid MarkerEvent"),
    (b"@ringtrain-task:abc:exit 0\n", "code=<n> or signal=<n>, not '0'"),
    (b"@ringtrain-task:abc:exit code=x\n", "code=<n> or signal=<n>, not 'code=x'"),
    (b"@ringtrain-task:abc:started\n", "a started marker carries a pid, not ''"),
])
def test_malformed_marker_is_refused_with_what_was_wrong(line: bytes, why: str):
    with pytest.raises(ValueError, match="malformed task wrapper marker") as raised:
        split_marker("abc", line)
    assert why in str(raised.value)


@pytest.mark.parametrize("command, script", [
    (["python", "train.py", "--lr", "1"], "train.py"),
    (["python3.11", "-u", "-W", "ignore", "-X", "dev", "dir/t.py"], "dir/t.py"),
    (["/venv/bin/python", "-m", "pkg.train"], None),
    (["python", "-c", "print(1)"], None),
    (["python", "-mpkg"], None),
    (["python"], None),
    (["bash", "run.sh"], None),
])
def test_python_script_detection(command, script):
    assert python_script(command) == script


def test_check_command(tmp_path):
    (tmp_path / "ok.py").write_text("")
    environ = {"PATH": "/usr/bin:/bin"}
    check_command([sys.executable, "ok.py"], str(tmp_path), environ)
    with pytest.raises(ConfigError, match=r"missing.py: no such file \(looked in"):
        check_command([sys.executable, "missing.py"], str(tmp_path), environ)
    with pytest.raises(ConfigError, match="'no-such-program' is not on PATH"):
        check_command(["no-such-program"], str(tmp_path), environ)
    with pytest.raises(ConfigError, match="'/nope/python' does not exist"):
        check_command(["/nope/python", "ok.py"], str(tmp_path), environ)


def test_which_hosts_are_this_machine():
    addresses = frozenset(network.interface_addresses().values())
    assert "127.0.0.1" in addresses
    assert network.is_this_machine("localhost", addresses)
    assert network.is_this_machine(socket.gethostname(), addresses)
    assert network.is_this_machine("127.0.0.1", addresses)
    assert not network.is_this_machine("127.0.0.2", addresses)  # stands for a second host
    # Names under .localhost are loopback (RFC 6761): the job service's local nodes
    assert network.is_this_machine("node3.localhost", addresses)
    assert network.is_loopback("Node3.LOCALHOST.")
    assert not network.is_this_machine("localhost.example", addresses)
    assert network.is_loopback("127.0.0.2") and network.is_loopback("localhost")
    assert not network.is_loopback("10.1.2.3")
    assert network.route_source("127.0.0.2") == "127.0.0.1"
    assert network.loopback_interface(network.interface_addresses()) == "lo"


def test_lifecycle_table():
    assert check_transition(RankState.STARTING, RankState.RUNNING) is RankState.RUNNING
    with pytest.raises(TransitionError, match="from succeeded to failed"):
        check_transition(RankState.SUCCEEDED, RankState.FAILED)
    with pytest.raises(TransitionError):
        check_transition(RankState.STARTING, RankState.SUCCEEDED)
    assert RankState.STOPPED.is_terminal and not RankState.RUNNING.is_terminal


def _outcome(rank, state, **kw):
    return RankOutcome(rank, "localhost" if rank < 2 else "node2", state, **kw)


def test_result_messages_and_exit_codes():
    ok = RunResult((_outcome(0, RankState.SUCCEEDED, exit_code=0),), (), None, 0)
    assert (ok.exit_code, ok.message) == (0, "all 1 ranks succeeded")

    failed = _outcome(1, RankState.FAILED, exit_code=3)
    result = RunResult((_outcome(0, RankState.STOPPED), failed, _outcome(2, RankState.STOPPED)),
                       (failed,), None, 2)
    assert result.exit_code == 1
    assert result.message == "rank 1 on localhost exited with code 3; stopped the other 2 ranks"

    killed = _outcome(0, RankState.FAILED, signal=signal.SIGKILL)
    result = RunResult((killed, _outcome(1, RankState.STOPPED)), (killed,), None, 1)
    assert result.message == ("rank 0 on localhost was killed by signal SIGKILL; "
                              "stopped the other 1 rank")

    late = [_outcome(r, RankState.START_FAILED, reason="ssh: timed out") for r in (2, 3)]
    result = RunResult((_outcome(0, RankState.STOPPED), *late), tuple(late), None, 1)
    assert result.exit_code == 2
    assert result.message == ("ranks 2, 3 on node2 did not start: ssh: timed out; "
                              "stopped the other 1 rank")

    interrupted = RunResult((_outcome(0, RankState.STOPPED),), (), signal.SIGINT, 1)
    assert interrupted.exit_code == 130
    assert interrupted.message == "interrupted by signal SIGINT; stopped 1 rank"


def test_network_plan_loopback_job_and_explicit_interfaces():
    assert plan_network(["localhost", "127.0.0.2"], []) == NetworkPlan(
        "127.0.0.1", ("lo",), False, frozenset({"localhost"}))
    net = plan_network(["localhost"], ["lo"])
    assert (net.master_addr, net.socket_ifnames, net.ifnames_explicit) == (
        "127.0.0.1", ("lo",), True)
    with pytest.raises(ConfigError, match="--network-interfaces: nosuch0 has no IPv4 address"):
        plan_network(["localhost"], ["nosuch0"])
