"""Job specs: every field's validation, file loading, the published schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import JobSpec, Priority, load_job_spec, parse_job_spec

GOOD = {"node_count": 2, "command": "python train.py"}


@pytest.mark.parametrize("field,value,says", [
    ("name", "has space", "only letters, digits"),
    ("name", "x" * 64, "at most 63"),
    ("experiment", "-leading", "start with a letter or digit"),
    ("node_count", 0, "greater than or equal to 1"),
    ("node_count", "2", "valid integer"),
    ("process_count_per_node", 0, "greater than or equal to 1"),
    ("command", "   ", "must not be blank"),
    ("command", 42, "valid string"),
    ("working_dir", ["a"], "valid string"),
    ("environment", {"1BAD": "x"}, "not a valid variable name"),
    ("environment", {"RINGTRAIN_JOB_ID": "x"}, "set by ringtrain itself"),
    ("environment", "A=1", "valid dictionary"),
    ("job_preparation", 3, "valid string"),
    ("inputs", {"bad-name": "/tmp"}, "start with a letter"),
    ("outputs", ["model", "model"], "repeated: model"),
    ("outputs", ["a/b"], "start with a letter"),
    ("max_wall_clock_time", 0, "greater than 0"),
    ("max_retries", -1, "greater than or equal to 0"),
    ("max_retries", 1.5, "valid integer"),
    ("priority", "urgent", "'low', 'normal' or 'high'"),
    ("node_cout", 3, "unknown field; allowed fields: name, experiment, node_count"),
])
def test_each_bad_field_is_named_with_what_is_allowed(field: str, value: object,
                                                      says: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job_spec({**GOOD, field: value})
    fields = [err["field"].split(".")[0] for err in e.value.errors]
    assert fields == [field]
    assert says in e.value.errors[0]["message"]
    assert f"  {field}" in str(e.value)


def test_all_bad_fields_are_reported_at_once() -> None:
    with pytest.raises(SpecError) as e:
        parse_job_spec({"node_count": -1, "priority": "x"})
    assert {err["field"] for err in e.value.errors} == {"node_count", "priority", "command"}
    assert any(err["message"] == "Field required" for err in e.value.errors)


def test_defaults_and_conversions() -> None:
    spec = parse_job_spec({**GOOD, "environment": {"EPOCHS": 1, "FAST": True}})
    assert spec.process_count_per_node == 1 and spec.max_retries == 0
    assert spec.priority is Priority.NORMAL
    assert spec.environment == {"EPOCHS": "1", "FAST": "true"}
    assert spec.total_processes == 2


def test_loads_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("node_count: 2\ncommand: echo hi\noutputs: [model]\n")
    (tmp_path / "s.json").write_text(json.dumps({**GOOD, "priority": "high"}))
    assert load_job_spec(tmp_path / "s.yaml").outputs == ["model"]
    assert load_job_spec(tmp_path / "s.json").priority is Priority.HIGH


@pytest.mark.parametrize("text,says", [
    ("node_count: [1\n", "not valid YAML/JSON"),
    ("- a\n- b\n", "must be a mapping"),
])
def test_bad_files(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError, match=says):
        load_job_spec(tmp_path / "s.yaml")
    with pytest.raises(SpecError, match="cannot read"):
        load_job_spec(tmp_path / "missing.yaml")


def test_schema_publishes_every_field() -> None:
    schema = JobSpec.model_json_schema()
    assert set(schema["properties"]) == set(JobSpec.model_fields)
    assert set(schema["required"]) == {"node_count", "command"}
    assert schema["additionalProperties"] is False
