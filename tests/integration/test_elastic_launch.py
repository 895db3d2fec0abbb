"""Elastic `ringtrain run` end to end: real workers on this machine, a real discovery script.

The training script (``elastic_train.py``) prints what every rank does as JSON lines; the tests
drive the discovery script's answer and kill workers, then check the story the lines tell.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from launcher_workers import CONTROLLED, cli, read_pids, run_job, wait_dead, write_script

from tests.waiting import wait_until

SCRIPT = str(Path(__file__).resolve().parent / "elastic_train.py")
SAMPLES = 144


class Job:
    """`ringtrain run ARGV` in its own process; its rank lines are parsed as they arrive."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None):
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
        environ |= {"OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ringtrain.cli", "run", *argv], cwd=cwd, env=environ,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events: list[dict] = []
        self._stderr: list[str] = []
        self._arrived: queue.SimpleQueue[dict] = queue.SimpleQueue()
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._stderr.extend, args=(self.proc.stderr,),
                                          daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            _, sep, text = line.partition("]<stdout>:")
            if sep and text.startswith("{"):
                event = json.loads(text)
                self.events.append(event)
                self._arrived.put(event)

    def wait_for(self, predicate: Callable[[dict], bool], timeout_s: float = 90) -> dict:
        """The first event from now on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            ended = self.proc.poll() is not None and self._arrived.empty()
            assert remaining > 0 and not ended, (
                f"no such event; the job {'ended' if ended else 'runs'}: {''.join(self._stderr)}")
            try:
                event = self._arrived.get(timeout=min(max(remaining, 0.01), 0.5))
            except queue.Empty:
                continue
            if predicate(event):
                return event

    def finish(self, timeout_s: float = 120) -> tuple[int, str]:
        """Wait for the launcher (killed after ``timeout_s``); its exit status and stderr."""
        try:
            self.proc.wait(timeout=timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            for reader in self._readers:
                reader.join(10)
        return self.proc.returncode, "".join(self._stderr)

    def of(self, kind: str, **fields) -> list[dict]:
        return [e for e in self.events
                if e["event"] == kind and all(e.get(k) == v for k, v in fields.items())]


@functools.cache
def one_process_result() -> dict:
    """The last line of ``elastic_train.py`` run as one process without a launcher: the weights
    of an uninterrupted run. The run is seeded, so every test compares with the same line: it
    runs once per test process."""
    with tempfile.TemporaryDirectory() as cwd:
        reference = subprocess.run([sys.executable, SCRIPT], cwd=cwd, capture_output=True,
                                   text=True, timeout=120,
                                   env={k: v for k, v in os.environ.items()
                                        if not k.startswith(("HOROVOD_", "RINGTRAIN_"))})
    assert reference.returncode == 0, reference.stderr
    return json.loads(reference.stdout.splitlines()[-1])


def _discovery(tmp_path: Path, hosts: str) -> None:
    """A discovery script printing ``hosts.txt`` and logging each answer to ``seen.txt``."""
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat hosts.txt | tee -a seen.txt\n")
    script.chmod(0o755)
    _offer(tmp_path, hosts)


def _offer(tmp_path: Path, hosts: str) -> None:
    (tmp_path / "hosts.tmp").write_text(hosts + "\n")
    os.replace(tmp_path / "hosts.tmp", tmp_path / "hosts.txt")  # never read half-written


def _seen_after(tmp_path: Path, offset: int, hosts: str) -> None:
    wait_until(lambda: hosts in (tmp_path / "seen.txt").read_text()[offset:],
               f"discovery's answer {hosts!r}")


@pytest.mark.slow
def test_killed_worker_is_survived_from_the_last_commit_and_slots_come_and_go(tmp_path):
    # localhost:3, worker 1 killed -> 2 ranks from the last commit; localhost:2, then :3 -> a new
    # worker 3 joins at a commit; localhost:2 again -> worker 3 leaves at a commit.
    _discovery(tmp_path, "localhost:3")
    job = Job(["-np", "3", "--min-np", "2", "--max-np", "3", "--reset-limit", "3",
               "--host-discovery-script", "./discover.sh", "--elastic-timeout", "60",
               "--output-filename", "logs", sys.executable, SCRIPT], tmp_path,
              env={"RINGTRAIN_TEST_PAUSE": "1:0:6"})
    try:
        pause = job.wait_for(lambda e: e["event"] == "pause")
        victim = job.of("start", worker=1)[0]["pid"]
        os.kill(victim, signal.SIGKILL)  # mid-epoch, while its peers wait in an allreduce
        offset = len((tmp_path / "seen.txt").read_text())
        _offer(tmp_path, "localhost:2")
        job.wait_for(lambda e: e["event"] == "batch" and e["size"] == 2)
        _seen_after(tmp_path, offset, "localhost:2")
        _offer(tmp_path, "localhost:3")  # a slot comes back: a new worker joins at a commit
        job.wait_for(lambda e: e["event"] == "batch" and e["size"] == 3 and e["worker"] == 3)
        _offer(tmp_path, "localhost:2")  # and goes again: the newest worker leaves
        job.wait_for(lambda e: e["event"] == "reset" and e["size"] == 2)
    finally:
        code, err = job.finish()
    assert pause["worker"] == 1
    assert code == 0, err
    assert err.splitlines()[-1] == ("ringtrain run: worker 1 on localhost was killed by signal "
                                    "SIGKILL; re-forming the world without it")

    # The survivors went on from the last commit: none lost, none repeated.
    first_reset = next(i for i, e in enumerate(job.events) if e["event"] == "reset")
    last_commit = max(e["commits"] for e in job.events[:first_reset]
                      if e["event"] == "commit" and e["worker"] != 1)
    resets = job.of("reset")
    assert [(e["worker"], e["size"]) for e in sorted(resets, key=lambda e: e["worker"])] == [
        (0, 2), (0, 3), (0, 2), (2, 2), (2, 3), (2, 2)]
    assert {e["commits"] for e in resets[:2]} == {last_commit}
    first_after = job.of("batch", size=2)[0]
    assert first_after["commits"] == last_commit and first_after["epoch"] == 0

    # The new worker 3 joined a world of 3 at a commit, and left the same way: the commit count
    # the survivors reset with is one that worker 3 reported too.
    joined, left = resets[2:4], resets[4:]
    assert {e["size"] for e in joined} == {3} and {e["size"] for e in left} == {2}
    assert job.of("start", worker=3) and (tmp_path / "logs" / "rank.3" / "stdout").exists()
    assert {e["commits"] for e in left} <= {e["commits"] for e in job.of("commit", worker=3)}

    # Within every epoch every sample was trained on exactly once, as far as the committed
    # state goes (what the failed step had done was rolled back).
    epochs = job.of("epoch")
    assert [e["epoch"] for e in epochs] == [0, 1, 2, 3]
    for epoch in epochs:
        assert sorted(epoch["trained"]) == list(range(SAMPLES))

    # The result is an uninterrupted run's: every step took the same global batch, so only the
    # order of the sums differs. The reference runs as one process: its batches of 12 are the
    # unions of what 3 ranks take.
    done = job.of("done")
    assert sorted(e["worker"] for e in done) == [0, 2]
    assert len({json.dumps(e["weight"]) for e in done}) == 1
    expected = one_process_result()
    assert expected["size"] == 1
    for got, want in zip(done[0]["weight"] + [done[0]["bias"]],
                         expected["weight"] + [expected["bias"]]):
        assert got == pytest.approx(want, abs=1e-5)


def test_reset_limit_ends_the_job_when_a_worker_fails_once_too_often(tmp_path):
    script = write_script(tmp_path, "ctl.py", CONTROLLED)
    proc = cli(["-np", "2", "--min-np", "1", "--reset-limit", "0", sys.executable, script,
                "sleep"], tmp_path)
    try:
        pids = read_pids(tmp_path, 2)
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert err.splitlines()[-1] == (
        "ringtrain run: the world must be re-formed again, but --reset-limit allows 0 re-forms; "
        "stopping the job; stopped 1 rank")
    assert wait_dead(pids, timeout_s=5) == []


def test_too_few_slots_for_the_elastic_timeout_end_the_job(tmp_path):
    _discovery(tmp_path, "localhost:1")
    result = run_job(["-np", "2", "--host-discovery-script", str(tmp_path / "discover.sh"),
                      "--elastic-timeout", "1", sys.executable, "-c", "pass"], tmp_path)
    assert result.exit_code == 1 and result.outcomes == ()
    assert result.message == ("fewer than 2 slots were available for 1 s (--elastic-timeout); "
                              "the hosts offer 1")


def test_a_discovery_script_that_fails_at_the_start_is_a_bad_launch(tmp_path):
    (tmp_path / "discover.sh").write_text("#!/bin/sh\necho 'no cluster' >&2\nexit 3\n")
    (tmp_path / "discover.sh").chmod(0o755)
    proc = cli(["-np", "1", "--host-discovery-script", "./discover.sh", sys.executable, "-c",
                "pass"], tmp_path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    # (the launch banner's line on threads per rank may come first)
    assert err.strip().splitlines()[-1] == ("ringtrain run: --host-discovery-script "
                                            "./discover.sh exited with code 3: no cluster")
