"""Naming the peer that died: a process on this host that is gone, a zombie, or a reused pid."""

from __future__ import annotations

import subprocess
import sys

from ringtrain.engine.peers import PeerProcess, Peers


def _child() -> tuple[subprocess.Popen, PeerProcess]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    me = PeerProcess.this("h")
    fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return proc, PeerProcess("h", proc.pid, me.machine, int(fields[19]))


def test_a_peer_on_this_host_whose_process_is_killed_is_named_dead():
    proc, peer = _child()
    try:
        peers = Peers(0, [PeerProcess.this("h"), peer, PeerProcess.this("h")])
        assert peers.dead() == []
        proc.kill()  # not reaped yet: a zombie is dead too
        assert peers.wait_for_dead(settle_s=5.0) == [1]
        assert peers.failure_cause([1]) == (
            f"rank 1 (host h, pid {proc.pid}) died (its process is gone: it exited or was "
            "killed)")
    finally:
        proc.kill()
        proc.wait()
    assert peers.dead() == [1]  # reaped: no such process


def test_peers_on_other_machines_or_with_another_start_are_told_apart():
    proc, peer = _child()
    try:
        elsewhere = PeerProcess("h", proc.pid + 1, "another-boot/pid:[1]", 0)
        reused = PeerProcess("h", proc.pid, peer.machine, peer.start_ticks + 1)
        other_name = PeerProcess("node2.localhost", proc.pid, peer.machine, peer.start_ticks)
        peers = Peers(0, [PeerProcess.this("h"), elsewhere, reused, peer, other_name])
        assert peers.dead() == [2]  # a host name of the same machine is looked at too
        assert Peers(0, []).wait_for_dead(settle_s=0.1) == []  # nothing known: nobody named
    finally:
        proc.kill()
        proc.wait()


def test_a_failed_collective_names_the_dead_peer_or_says_a_rank_most_likely_failed():
    proc, peer = _child()
    try:
        peers = Peers(0, [PeerProcess.this("h"), peer])
        proc.kill()
        error = peers.collective_failure(RuntimeError("connection reset"))
        assert str(error) == (f"a collective failed on rank 0, because rank 1 (host h, pid "
                              f"{proc.pid}) died (its process is gone: it exited or was "
                              "killed): connection reset")
    finally:
        proc.kill()
        proc.wait()
    assert str(Peers(1, []).collective_failure(RuntimeError("reset"))) == (
        "a collective failed on rank 1, most likely because another rank failed or exited: reset")
