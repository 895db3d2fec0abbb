"""How long the job service takes to refuse hostile specs: the timing goals of issue 15.

The tests (tests/jobs/test_spec.py, test_api_abuse.py) check that these inputs are refused, and
with what message; how fast is measured here, where a loaded machine makes a figure slower but
never a test red. Each case runs ``--repeats`` times in this process:

- a spec with 40,000 output names (379 KiB of JSON; a quadratic uniqueness check took 17 s);
- a YAML "billion laughs" file of 500 bytes (expanded: minutes and gigabytes);
- 50,000 unknown fields (each error lists the allowed fields: the answer must stay short).

Prints one JSON line: the median and worst seconds of each, and whether each met its goal.

    python benchmarks/spec_limits.py
    python benchmarks/spec_limits.py --repeats 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loopback_ray import machine

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import load_job_spec, parse_job_spec

GOOD = {"node_count": 1, "command": "true"}
LAUGHS = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                   + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]"
                      for i in range(8)]) + "\nnode_count: 1\ncommand: *i\n"
#: Seconds each case may take at most (the worst of the repeats), with room for a busy machine.
GOALS_S = {"outputs_40000": 5.0, "yaml_alias_bomb": 10.0, "unknown_fields_50000": 5.0}


def _refused(make: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    try:
        make()
    except SpecError:
        return time.perf_counter() - t0
    raise AssertionError("the hostile spec was accepted")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="runs of each case (default 5)")
    args = p.parse_args(argv)
    where = machine()
    with tempfile.TemporaryDirectory(prefix="ringtrain-spec-limits-") as tmp:
        bomb = Path(tmp) / "bomb.yaml"
        bomb.write_text(LAUGHS)
        cases: dict[str, Callable[[], object]] = {
            "outputs_40000": lambda: parse_job_spec(
                {**GOOD, "outputs": [f"o{i}" for i in range(40_000)]}),
            "yaml_alias_bomb": lambda: load_job_spec(bomb),
            "unknown_fields_50000": lambda: parse_job_spec(
                {**GOOD, **{f"f{i}": "x" * 20 for i in range(50_000)}}),
        }
        times = {name: [_refused(make) for _ in range(args.repeats)]
                 for name, make in cases.items()}
    figures = {name: {"median_s": round(statistics.median(v), 4), "max_s": round(max(v), 4)}
               for name, v in times.items()}
    goals = {f"{name}_max_le_{GOALS_S[name]:g}s": max(v) <= GOALS_S[name]
             for name, v in times.items()}
    print(json.dumps({"benchmark": "spec_limits", "machine": where, **figures, "goals": goals}))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
