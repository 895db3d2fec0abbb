"""Host discovery: the script's output, its failures, and the poller that keeps the last answer."""

from __future__ import annotations

import pytest

from ringtrain.runner.discovery import DiscoveryError, HostPoller, parse_discovered, run_script
from tests.waiting import wait_until


def test_output_is_one_host_per_line_with_optional_slots():
    assert parse_discovered("node1:4\n\n  node2  \n127.0.0.1:2\n", "x") == {
        "node1": 4, "node2": 1, "127.0.0.1": 2}
    assert parse_discovered("\n", "x") == {}  # no host available right now
    assert parse_discovered("a\nb:1\n", "x", default_slots=4) == {"a": 4, "b": 1}


@pytest.mark.parametrize("text, words", [
    ("node1:four\n", "slots 'four' is not a whole number"),
    ("node1:2\nnode1:3\n", "lists host 'node1' twice"),
    ("bad host\n", "is not a host name"),
])
def test_bad_output_names_the_problem(text, words):
    with pytest.raises(DiscoveryError, match=words):
        parse_discovered(text, "--host-discovery-script d.sh output")


def _script(tmp_path, body: str, executable: bool = True) -> str:
    path = tmp_path / "discover.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755 if executable else 0o644)
    return str(path)


def test_a_script_is_run_and_its_failures_are_named(tmp_path):
    assert run_script(_script(tmp_path, "echo a:2; echo b\n")) == {"a": 2, "b": 1}
    with pytest.raises(DiscoveryError, match="exited with code 3: nope"):
        run_script(_script(tmp_path, "echo nope >&2; exit 3\n"))
    with pytest.raises(DiscoveryError, match="did not finish within 0.2 s"):
        run_script(_script(tmp_path, "sleep 5\n"), timeout_s=0.2)
    # it runs in the job's directory
    (tmp_path / "hosts.txt").write_text("c:3\n")
    assert run_script(_script(tmp_path, "cat hosts.txt\n"), cwd=str(tmp_path)) == {"c": 3}
    with pytest.raises(DiscoveryError, match="must be an executable file"):
        run_script(_script(tmp_path, "echo a\n", executable=False))


def test_the_poller_keeps_the_last_good_answer(tmp_path):
    answers = iter([{"a": 1}, {"a": 2}])
    failed = 0

    def discover() -> dict[str, int]:
        nonlocal failed
        try:
            return next(answers)
        except StopIteration:
            failed += 1
            raise DiscoveryError("the cluster API is down") from None

    poller = HostPoller(discover, interval_s=0.01)
    poller.start()
    try:
        assert poller.latest() in ({"a": 1}, {"a": 2})
        wait_until(lambda: failed >= 3, "three failed polls after the second answer")
        assert poller.latest() == {"a": 2}
    finally:
        poller.stop()


def test_a_first_discovery_that_fails_fails_the_start():
    def discover() -> dict[str, int]:
        raise DiscoveryError("no such cluster")

    with pytest.raises(DiscoveryError, match="no such cluster"):
        HostPoller(discover).start()
