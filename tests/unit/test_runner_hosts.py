"""Host parsing and Horovod's rank assignment (pure functions)."""

from __future__ import annotations

import pytest

from ringtrain.contract.slots import SlotInfo
from ringtrain.runner.hosts import HostInfo, assign, parse_hostfile, parse_hosts


def test_parse_hosts_with_slots_in_order():
    assert parse_hosts("node1:2, node-2.example.com:4,10.0.0.3:1") == [
        HostInfo("node1", 2), HostInfo("node-2.example.com", 4), HostInfo("10.0.0.3", 1)]


def test_parse_hosts_without_slots_means_one_slot():
    assert parse_hosts("a,b:3") == [HostInfo("a", 1), HostInfo("b", 3)]


@pytest.mark.parametrize("spec, words", [
    ("a:2,,b:1", "empty entry"),
    ("a:two", "not a whole number"),
    ("a:0", "at least 1"),
    ("a:-1", "at least 1"),
    (":2", "not a host name"),
    ("a b:2", "not a host name"),
    ("a:1:2", "not host:slots"),
    ("a:1,a:2", "twice"),
])
def test_parse_hosts_rejects_malformed_entries(spec, words):
    with pytest.raises(ValueError, match=words) as info:
        parse_hosts(spec)
    assert "-H/--hosts" in str(info.value)


def test_parse_hostfile_comments_blank_lines_and_default_slots():
    text = "# cluster\nnode1 slots=4\n\n  node2   slots=2  # GPU box\nnode3\n"
    assert parse_hostfile(text) == [HostInfo("node1", 4), HostInfo("node2", 2),
                                    HostInfo("node3", 1)]


@pytest.mark.parametrize("text, words", [
    ("node1 slots=x\n", "line 1.*whole number"),
    ("ok slots=1\nnode1 cpus=4\n", "line 2.*HOST slots=N"),
    ("# nothing\n\n", "names no host"),
    ("a slots=1\na slots=2\n", "twice"),
])
def test_parse_hostfile_errors_name_the_line(text, words):
    with pytest.raises(ValueError, match=words):
        parse_hostfile(text)


def _tuples(slots: list[SlotInfo]):
    return [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size)
            for s in slots]


def test_assign_fills_hosts_in_order():
    slots = assign([HostInfo("a", 2), HostInfo("b", 2)], 4)
    assert _tuples(slots) == [
        ("a", 0, 0, 2, 0, 2, 4), ("a", 1, 1, 2, 0, 2, 4),
        ("b", 2, 0, 2, 1, 2, 4), ("b", 3, 1, 2, 1, 2, 4)]


def test_assign_uneven_hosts_cross_counts_only_hosts_with_that_local_rank():
    # Horovod: cross_rank = index among the hosts that have this local rank.
    slots = assign([HostInfo("a", 2), HostInfo("b", 1), HostInfo("c", 3)], 6)
    assert _tuples(slots) == [
        ("a", 0, 0, 2, 0, 3, 6), ("a", 1, 1, 2, 0, 2, 6),
        ("b", 2, 0, 1, 1, 3, 6),
        ("c", 3, 0, 3, 2, 3, 6), ("c", 4, 1, 3, 1, 2, 6), ("c", 5, 2, 3, 0, 1, 6)]


def test_assign_fewer_ranks_than_slots_leaves_later_hosts_empty():
    slots = assign([HostInfo("a", 2), HostInfo("b", 2), HostInfo("c", 2)], 3)
    assert _tuples(slots) == [
        ("a", 0, 0, 2, 0, 2, 3), ("a", 1, 1, 2, 0, 1, 3), ("b", 2, 0, 1, 1, 2, 3)]


def test_assign_localhost_2_plus_second_host_1():
    slots = assign([HostInfo("localhost", 2), HostInfo("127.0.0.2", 1)], 3)
    assert _tuples(slots) == [
        ("localhost", 0, 0, 2, 0, 2, 3), ("localhost", 1, 1, 2, 0, 1, 3),
        ("127.0.0.2", 2, 0, 1, 1, 2, 3)]


def test_assign_single_host():
    assert _tuples(assign([HostInfo("localhost", 4)], 4)) == [
        ("localhost", r, r, 4, 0, 1, 4) for r in range(4)]


@pytest.mark.parametrize("np", [0, 5])
def test_assign_rejects_np_outside_slots(np):
    with pytest.raises(ValueError, match=f"cannot place {np} ranks on 4 slots"):
        assign([HostInfo("a", 2), HostInfo("b", 2)], np)


def test_assign_invariants_on_many_layouts():
    for layout in ([1], [3, 1, 2], [1, 1, 1, 1], [4, 4], [2, 5, 1, 3]):
        hosts = [HostInfo(f"h{i}", n) for i, n in enumerate(layout)]
        for np in range(1, sum(layout) + 1):
            slots = assign(hosts, np)
            assert [s.rank for s in slots] == list(range(np))
            for s in slots:
                same_host = [t for t in slots if t.hostname == s.hostname]
                same_local = [t for t in slots if t.local_rank == s.local_rank]
                assert s.local_size == len(same_host)
                assert s.cross_size == len(same_local)
                assert sorted(t.cross_rank for t in same_local) == list(range(s.cross_size))
