"""`ringtrain job submit SPEC --set KEY=VALUE --args "..."`: changes at submit time, recorded
in the job's spec as submitted; bad ones refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import parse_job_spec
from ringtrain.jobs.models.overrides import apply_overrides

from .conftest import CLI

BASE = {"node_count": 2, "command": "python train.py", "environment": {"A": "1"}}


def test_sets_are_typed_entries_merge_and_args_extend_the_command() -> None:
    spec = apply_overrides(parse_job_spec(BASE), ["node_count=1", "environment.SEED=3",
                                                  "max_wall_clock_time=60", "outputs=[model]"],
                           "--epochs 1")
    assert spec.node_count == 1 and spec.max_wall_clock_time == 60
    assert spec.environment == {"A": "1", "SEED": "3"} and spec.outputs == ["model"]
    assert spec.command == "python train.py --epochs 1"


@pytest.mark.parametrize(("item", "field"), [("node_count=0", "node_count"),
                                            ("nodes=2", "nodes"), ("node_count", "--set"),
                                            ("command.x=1", "command.x")])
def test_a_bad_override_names_its_field(item: str, field: str) -> None:
    with pytest.raises(SpecError) as refused:
        apply_overrides(parse_job_spec(BASE), [item])
    assert [e["field"] for e in refused.value.errors] == [field]


def test_the_submitted_spec_records_the_overrides(home: Home, cli: CLI, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("node_count: 1\ncommand: echo hello\n")
    assert cli("cluster", "create", "c", "--nodes", "1")[0] == 0
    rc, out, err = cli("job", "submit", str(spec), "--cluster", "c", "--set",
                       "environment.WHO=you", "--set", "max_retries=1", "--args", "there",
                       "-o", "json")
    assert rc == 0, err
    job = json.loads(out)
    assert job["spec"]["command"] == "echo hello there"
    assert job["spec"]["environment"] == {"WHO": "you"} and job["spec"]["max_retries"] == 1
    rc, out, _ = cli("job", "show", job["id"], "-o", "json")
    assert json.loads(out)["spec"]["command"] == "echo hello there"
    rc, _, err = cli("job", "submit", str(spec), "--cluster", "c", "--set", "node_count=x")
    assert rc != 0 and "node_count" in err
