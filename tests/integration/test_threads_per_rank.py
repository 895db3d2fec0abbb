"""`ringtrain run` shares each host's cores among its ranks (OMP_NUM_THREADS, torch's threads)
unless the user set OMP_NUM_THREADS, and says so once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ringtrain.runner.threads import (
    default_threads_environ,
    threads_per_rank,
    usable_cores,
)

ROOT = Path(__file__).resolve().parents[2]
_PROBE = ("import os, torch; "
          "print('threads', torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])")


def _run(np: int, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RINGTRAIN_", "HOROVOD_")) and k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return subprocess.run([sys.executable, "-m", "ringtrain.cli", "run", "-np", str(np),
                           sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_rule_divides_the_cores_and_leaves_a_users_choice_alone():
    assert [threads_per_rank(16, n) for n in (1, 2, 3, 16, 32)] == [16, 8, 5, 1, 1]
    assert default_threads_environ({"LOCAL_WORLD_SIZE": "4"}, cores=8) == {"OMP_NUM_THREADS": "2"}
    assert default_threads_environ({"LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "3"}, 8) == {}
    assert default_threads_environ({}, cores=8) == {}  # not a rank of a launch


def test_two_ranks_share_the_cores_and_the_banner_says_so_once():
    result = _run(2)
    assert result.returncode == 0, result.stderr
    expected = threads_per_rank(usable_cores(), 2)
    lines = [x for x in result.stdout.splitlines() if "threads" in x]
    assert len(lines) == 2 and all(x.endswith(f"threads {expected} {expected}") for x in lines)
    assert result.stderr.count("each rank gets OMP_NUM_THREADS") == 1


def test_a_users_omp_num_threads_is_kept_and_not_announced():
    result = _run(2, OMP_NUM_THREADS="3")
    assert result.returncode == 0, result.stderr
    lines = [x for x in result.stdout.splitlines() if "threads" in x]
    # kept as given (torch may cap its pool at the machine's cores)
    assert len(lines) == 2 and all(x.endswith(" 3") for x in lines)
    assert "OMP_NUM_THREADS" not in result.stderr
