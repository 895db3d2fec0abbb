"""Shared memory between the ranks of a host: which backend a world gets, hierarchical allreduce
across (simulated) hosts, and no hang and no leak when ranks are killed with SIGKILL.

Each rank of a `World` is its own process, so the segments, the kills and the sweep are real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import ringtrain.torch as hvd
from ringtrain.backends.shm_segment import Segment
from ringtrain.shm_names import SHM_DIR
from ringtrain.torch import runtime
from tests.multiproc.world import World, exited, outcome_of, rank_0_after_rank_1_died
from tests.waiting import wait_until

_REPO = Path(__file__).resolve().parents[2]
_KINDS = ("allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
          "reducescatter")


def _backend_name() -> str:
    return type(runtime.current().backend).__name__


def test_the_backend_follows_the_switch(world2):
    # The suite runs with shared memory unless RINGTRAIN_SHM=0 is exported: see that it does.
    expected = ("TorchDistributedBackend" if os.environ.get("RINGTRAIN_SHM") == "0"
                else "HierarchicalBackend")
    assert world2.run(_backend_name) == [expected] * 2


def test_no_shm_switch_gives_gloo_and_the_same_results():
    world = World(2, env={"RINGTRAIN_SHM": "0"})
    try:
        assert world.run(_backend_name) == ["TorchDistributedBackend"] * 2
        assert world.run(_reductions) == [_expected_reductions(2)] * 2
    finally:
        world.close()


def _reductions() -> dict:
    r, out = hvd.rank(), {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16,
                  torch.bool):
        for name, op in (("sum", hvd.Sum), ("min", hvd.Min), ("max", hvd.Max),
                         ("product", hvd.Product)):
            x = (torch.arange(6) % 3 == r) if dtype is torch.bool else (
                torch.arange(6) + r + 1).to(dtype)
            out[f"{dtype}.{name}"] = hvd.allreduce(x, op=op, name=f"red.{dtype}.{name}").tolist()
    out["avg"] = hvd.allreduce(torch.full((3,), float(r)), name="red.avg").tolist()
    out["gather"] = hvd.allgather(torch.full((r + 1, 2), r), name="red.gather").tolist()
    out["bcast"] = hvd.broadcast(torch.full((4,), float(r)), root_rank=hvd.size() - 1,
                                 name="red.bcast").tolist()
    return out


def _expected_reductions(n: int) -> dict:
    out = {}
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16,
                  torch.bool):
        xs = [(torch.arange(6) % 3 == r) if dtype is torch.bool else (
            torch.arange(6) + r + 1).to(dtype) for r in range(n)]
        for name, fn in (("sum", torch.add), ("min", torch.minimum), ("max", torch.maximum),
                         ("product", torch.mul)):
            acc = xs[0]
            for x in xs[1:]:
                if dtype is torch.bool:
                    acc = acc | x if name in ("sum", "max") else acc & x
                else:
                    acc = fn(acc, x)
            out[f"{dtype}.{name}"] = acc.tolist()
    out["avg"] = [sum(range(n)) / n] * 3
    out["gather"] = [[r, r] for r in range(n) for _ in range(r + 1)]
    out["bcast"] = [float(n - 1)] * 4
    return out


@pytest.mark.parametrize("hierarchical", ["1", "0"])
def test_ranks_on_two_hosts_allreduce_within_each_then_across(hierarchical):
    if hierarchical == "1" and os.environ.get("RINGTRAIN_SHM") == "0":
        pytest.skip("hierarchical allreduce needs shared memory")
    # hosts a, a, b: ranks 0 and 1 share memory; rank 2 is alone on its host, a leader
    world = World(3, env={"HOROVOD_HIERARCHICAL_ALLREDUCE": hierarchical},
                  rank_env=[{"HOROVOD_HOSTNAME": h} for h in ("hosta", "hosta", "hostb")])
    try:
        if os.environ.get("RINGTRAIN_SHM") != "0":
            assert world.run(_backend_name) == ["HierarchicalBackend"] * 3
        assert world.run(_reductions) == [_expected_reductions(3)] * 3
    finally:
        world.close()


def _gather_across_hosts() -> tuple[list, list, int]:
    backend = runtime.current().backend
    calls: list[int] = []
    across = backend._allgather_across

    def counted(*args):
        calls.append(1)
        return across(*args)

    backend._allgather_across = counted
    r = hvd.rank()
    rows = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int16), name="across.rows")
    flags = hvd.allgather(torch.tensor([r % 2 == 0]), name="across.flags")
    return rows.tolist(), flags.tolist(), len(calls)


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
def test_allgather_across_interleaved_hosts_goes_through_the_leaders_in_rank_order():
    # hosts a, b, a: ranks 0 and 2 share a segment, rank 1 is alone on its host
    world = World(3, rank_env=[{"HOROVOD_HOSTNAME": h} for h in ("hosta", "hostb", "hosta")])
    try:
        rows = [[r, r] for r in range(3) for _ in range(r + 1)]
        assert world.run(_gather_across_hosts) == [(rows, [True, False, True], 2)] * 3
        # a world over two hosts keeps its doorbell in the launcher's store
        assert world.run(_doorbell_name) == ["StoreDoorbell"] * 3
    finally:
        world.close()


def _die_in_the_middle(kind: str) -> str:
    """Rank 1 SIGKILLs itself inside the shared-memory collective, just before it would tell
    the others it has copied its data in; rank 0 reports what its operation raised."""
    n = hvd.size()
    if hvd.rank() == 1:
        def publish(self, step, phase):
            os.kill(os.getpid(), signal.SIGKILL)

        Segment.publish = publish
    start = {
        "allreduce": lambda: hvd.allreduce_async(torch.ones(1000), name=kind),
        "grouped_allreduce": lambda: hvd.grouped_allreduce_async(
            [torch.ones(10), torch.ones(3)], name=kind),
        "allgather": lambda: hvd.allgather_async(torch.ones(4, 2), name=kind),
        # the root writes; the others only read: the root must be the one that dies
        "broadcast": lambda: hvd.broadcast_async(torch.ones(8), root_rank=1, name=kind),
        "alltoall": lambda: hvd.alltoall_async(torch.ones(2 * n), name=kind),
        "reducescatter": lambda: hvd.reducescatter_async(torch.ones(4 * n), name=kind),
    }[kind]
    return outcome_of(lambda: hvd.synchronize(start()))


def _die_in_an_express_round() -> tuple[str, int]:
    """As :func:`_die_in_the_middle`, in a cached lone ``allreduce_``, which its caller's thread
    runs (the express round, docs/engine.md): rank 0's outcome, and how many express rounds its
    thread entered for that last call."""
    t = torch.ones(1000)
    for _ in range(3):  # the first is negotiated and cached; the others run in this thread
        hvd.allreduce_(t, name="express")
    executor = runtime.current().engine._executor
    run, entered = executor.run_lone_allreduce, []

    def entering(*args):
        entered.append(threading.current_thread().name)
        return run(*args)

    executor.run_lone_allreduce = entering  # type: ignore[method-assign]
    if hvd.rank() == 1:
        Segment.publish = lambda self, step, phase: os.kill(os.getpid(), signal.SIGKILL)
    outcome = outcome_of(lambda: hvd.allreduce_(t, name="express"))
    return outcome, entered.count(threading.current_thread().name)


def _doorbell_name() -> str:
    return type(runtime.current().engine._doorbell).__name__


def _die_before_submitting() -> str:
    """Rank 1 SIGKILLs itself before its peer's allreduce: rank 0 counts it, sleeps on the
    shared-memory doorbell for a ring that never comes, and must still fail, naming rank 1."""
    _die_on_rank_1(hvd.allgather_object(os.getpid()))
    return outcome_of(lambda: hvd.allreduce(torch.ones(4), name="never.counted.by.rank1"))


def _die_on_rank_1(pids: list[int]) -> None:
    """Rank 1 SIGKILLs itself; rank 0 returns once it is gone (``pids``: every rank's)."""
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    wait_until(lambda: exited(pids[1]), "rank 1's death")


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
def test_an_operation_waiting_on_the_shared_memory_doorbell_for_a_dead_rank_fails():
    world = World(2)
    try:
        assert world.run(_doorbell_name) == ["ShmDoorbell"] * 2
        outcome = rank_0_after_rank_1_died(world, _die_before_submitting)
    finally:
        world.close()
    assert "rank 1 (host " in outcome and " died (its process is gone" in outcome, outcome


def _lone_allreduces_in_the_callers_thread(path: str) -> tuple[list[float], int, int]:
    """Cached lone ``allreduce_`` calls: their sums, and how many of the timed five ran in this
    thread (the rest on the engine's); rank 0 writes their timeline to ``path``."""
    executor = runtime.current().engine._executor
    ran_in: list[str] = []
    # The general round and the express one (docs/engine.md, "The express round"), recorded.
    runs = {name: getattr(executor, name) for name in ("run", "run_lone_allreduce")}

    def recording(run):
        def record(*args):
            ran_in.append(threading.current_thread().name)
            return run(*args)
        return record

    for name, run in runs.items():
        setattr(executor, name, recording(run))
    t = torch.ones(8)
    for _ in range(3):  # the first one is negotiated and cached
        hvd.allreduce_(t, op=hvd.Sum, name="inline.lone")
    ran_in.clear()
    hvd.start_timeline(path)
    for _ in range(5):
        hvd.allreduce_(t, op=hvd.Sum, name="inline.lone")
    hvd.stop_timeline()
    for name, run in runs.items():
        setattr(executor, name, run)
    here = threading.current_thread().name
    return t.tolist(), ran_in.count(here), len(ran_in)


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
def test_a_lone_cached_allreduce_runs_in_its_callers_thread_and_on_the_timeline(tmp_path):
    world = World(2)
    path = str(tmp_path / "timeline.json")
    try:
        outcomes = world.run(_lone_allreduces_in_the_callers_thread, path)
    finally:
        world.close()
    for sums, inline, total in outcomes:
        assert sums == [2.0 ** 8] * 8
        assert total == 5 and inline >= 1, (inline, total)
    with open(path) as f:
        events = json.load(f)
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    phases = [e["name"] for e in events if e.get("ph") == "X" and rows[e["tid"]] == "inline.lone"]
    assert phases.count("NEGOTIATE_ALLREDUCE") == 5 and phases.count("SHM_ALLREDUCE") == 5


def _die_while_a_cached_round_is_claimed() -> str:
    """Rank 1 SIGKILLs itself after two cached lone allreduces: rank 0's third claims its
    round and waits for a bell that never comes; it must fail, naming rank 1."""
    pids = hvd.allgather_object(os.getpid())
    t = torch.ones(4)
    for _ in range(2):
        hvd.allreduce_(t, name="claimed.lone")
    _die_on_rank_1(pids)
    return outcome_of(lambda: hvd.allreduce_(t, name="claimed.lone"))


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
def test_a_caller_waiting_for_its_claimed_round_fails_when_its_peer_dies():
    world = World(2)
    try:
        outcome = rank_0_after_rank_1_died(world, _die_while_a_cached_round_is_claimed)
    finally:
        world.close()
    assert "rank 1 (host " in outcome and " died (its process is gone" in outcome, outcome


def _token() -> str:
    return runtime.current().backend._token


def _files(token: str) -> list[str]:
    return [name for name in os.listdir(SHM_DIR) if f"-{token}-" in name]


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
@pytest.mark.parametrize("kind", _KINDS)
def test_a_rank_killed_inside_a_shared_memory_collective_fails_its_peer(kind):
    world = World(2)
    try:
        token = world.run(_token)[0]
        assert _files(token) == []  # unlinked once every rank mapped it
        outcome = rank_0_after_rank_1_died(world, _die_in_the_middle, kind)
    finally:
        world.close()
    assert _files(token) == []
    assert outcome.startswith("HorovodInternalError: a collective failed on rank 0, because "
                              "rank 1 (host "), outcome
    assert " died (its process is gone: it exited or was killed): " in outcome, outcome


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
def test_a_rank_killed_inside_an_express_round_fails_its_peer_in_the_callers_thread():
    world = World(2)
    try:
        outcome, express = rank_0_after_rank_1_died(world, _die_in_an_express_round)
    finally:
        world.close()
    assert express == 1, "the call did not run in its caller's thread"
    assert outcome.startswith("HorovodInternalError: a collective failed on rank 0, because "
                              "rank 1 (host "), outcome
    assert " died (its process is gone: it exited or was killed): " in outcome, outcome


_KILL_ALL = textwrap.dedent("""
    import os, signal, sys
    from ringtrain.backends import shm_segment
    import ringtrain.torch as hvd

    # Both ranks die with SIGKILL while the segment exists: the first rank of the host right
    # after creating it, the other before mapping it. Nobody unlinks it.
    create, attach = shm_segment.Segment.create, shm_segment.Segment.attach

    def created(*args, **kwargs):
        segment = create(*args, **kwargs)
        print("SEGMENT", segment.path, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def attached(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    shm_segment.Segment.create = classmethod(lambda cls, *a, **k: created(*a, **k))
    shm_segment.Segment.attach = classmethod(lambda cls, *a, **k: attached(*a, **k))
    hvd.init()
""")


@pytest.mark.skipif(os.environ.get("RINGTRAIN_SHM") == "0", reason="shared memory is off")
def test_the_launcher_sweeps_the_segments_of_ranks_all_killed(tmp_path):
    script = tmp_path / "die.py"
    script.write_text(_KILL_ALL)
    env = {**os.environ, "PYTHONPATH": str(_REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", "-np", "2", sys.executable,
                           str(script)], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode != 0
    paths = [line.split("SEGMENT ", 1)[1].strip() for line in done.stdout.splitlines()
             if "SEGMENT " in line]
    assert len(paths) == 1, done.stdout + done.stderr
    assert paths[0].startswith(str(SHM_DIR / "ringtrain-"))
    assert not Path(paths[0]).exists()
