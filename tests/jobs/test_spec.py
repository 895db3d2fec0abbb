"""Job specs: every field's validation, file loading, the published schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models import JobSpec, Priority, load_job_spec, parse_job_spec

from .conftest import returns_within

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`

GOOD = {"node_count": 2, "command": "python train.py"}


@pytest.mark.parametrize("field,value,says", [
    ("name", "has space", "only letters, digits"),
    ("name", "x" * 64, "at most 63"),
    ("experiment", "-leading", "start with a letter or digit"),
    ("node_count", 0, "greater than or equal to 1"),
    ("node_count", "2", "valid integer"),
    ("process_count_per_node", 0, "greater than or equal to 1"),
    ("gpus_per_process", -1, "greater than or equal to 0"),
    ("gpus_per_process", 17, "less than or equal to 16"),
    ("gpus_per_process", 0.5, "valid integer"),
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
    assert spec.gpus_per_process == 0
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


# -- bounded, linear validation (issue 15) -------------------------------------------------------


def test_output_names_are_bounded_before_they_are_compared() -> None:
    # 379 KiB of JSON: a quadratic uniqueness check took 17 s (benchmarks/spec_limits.py times
    # it); the count is refused first.
    names = [f"o{i}" for i in range(40_000)]
    with pytest.raises(SpecError) as e:
        returns_within(60, parse_job_spec, {**GOOD, "outputs": names})
    assert e.value.errors[0]["field"] == "outputs"
    assert "at most 256" in e.value.errors[0]["message"]
    with pytest.raises(SpecError, match="repeated: o7"):
        parse_job_spec({**GOOD, "outputs": names[:200] + ["o7"]})


@pytest.mark.parametrize("field,value,says", [
    ("outputs", [f"o{i}" for i in range(257)], "at most 256"),
    ("inputs", {f"i{i}": "/data" for i in range(257)}, "at most 256"),
    ("environment", {f"V{i}": "x" for i in range(257)}, "at most 256"),
    ("environment", {"BIG": "x" * (64 * 1024 + 1)}, "at most 65536"),
    ("command", "x" * (131_071 + 1), "at most 131071"),
    ("job_preparation", "x" * (131_071 + 1), "at most 131071"),
    ("working_dir", "/" + "a/" * 2100, "at most 4096"),
    ("working_dir", "/" + "é/" * 1400, "at most 4096 bytes"),
    ("working_dir", "/tmp/" + "a" * 256, "longer than 255 bytes"),
    ("inputs", {"data": "/tmp/" + "é" * 128}, "longer than 255 bytes"),
    ("working_dir", "/tmp/a\0b", "NUL"),
    ("inputs", {"data": "/tmp/a\0b"}, "NUL"),
    ("command", "echo a\0b", "NUL"),
    ("job_preparation", "echo a\0b", "NUL"),
    ("environment", {"A": "a\0b"}, "NUL"),
    ("max_wall_clock_time", float("inf"), "finite"),
    ("max_wall_clock_time", float("nan"), "finite"),
])
def test_sizes_bytes_and_numbers_are_bounded(field: str, value: object, says: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_job_spec({**GOOD, field: value})
    assert [err["field"].split(".")[0] for err in e.value.errors] == [field]
    assert says in e.value.errors[0]["message"]
    assert len(str(e.value)) < 500  # the bad value is echoed, cut short


def test_errors_are_capped_and_echoes_cut() -> None:
    with pytest.raises(SpecError) as e:
        parse_job_spec({**GOOD, **{f"field{i}": "x" * 10_000 for i in range(1000)}})
    assert len(e.value.errors) == 21
    assert e.value.errors[-1] == {"field": "(spec)", "message": "... and 980 more errors"}
    assert len(str(e.value)) < 6000  # 20 errors, each listing the allowed fields


def test_url_inputs_keep_long_segments() -> None:
    url = "s3://bucket/key?sig=" + "a" * 300
    assert parse_job_spec({**GOOD, "inputs": {"data": url}}).inputs == {"data": url}


# -- spec files: size, encoding, YAML aliases and nesting (issue 15) ----------------------------

LAUGHS = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"]
                   + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]"
                      for i in range(8)]) + "\nnode_count: 1\ncommand: *i\n"


def test_yaml_alias_bomb_is_refused_unexpanded(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(LAUGHS)
    assert len(LAUGHS) < 500
    with pytest.raises(SpecError) as e:  # expanded: minutes and gigabytes
        returns_within(60, load_job_spec, tmp_path / "bomb.yaml")
    assert "aliases" in str(e.value) and "10000" in str(e.value)
    assert len(str(e.value)) < 1000


def test_a_few_aliases_still_work(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("x: &cmd echo hi\nnode_count: 1\ncommand: *cmd\n")
    with pytest.raises(SpecError, match="x: unknown field"):
        load_job_spec(tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text("environment: {A: &v '1', B: *v}\nnode_count: 1\n"
                                     "command: echo\n")
    assert load_job_spec(tmp_path / "s.yaml").environment == {"A": "1", "B": "1"}


def test_aliases_expanding_to_a_bad_value_print_a_short_error(tmp_path: Path) -> None:
    text = ("a: &a [xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx, yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy]\n"
            "b: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b]\n"
            "node_count: 1\ncommand: *c\noutputs: *c\nenvironment: *c\n")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError) as e:
        load_job_spec(tmp_path / "s.yaml")
    assert len(str(e.value)) < 2000


@pytest.mark.parametrize("text,says", [
    ("command: &c [*c]\nnode_count: 1\n", "refers to itself"),
    ("command: " + "[" * 5000 + "]" * 5000 + "\nnode_count: 1\n", "nested deeper than 32"),
])
def test_recursive_and_deep_yaml_is_refused(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(SpecError, match=says):
        load_job_spec(tmp_path / "s.yaml")


def test_deep_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"command": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(SpecError, match="nested too deeply"):
        load_job_spec(tmp_path / "s.json")


def test_spec_file_must_be_utf8_and_bounded(tmp_path: Path) -> None:
    (tmp_path / "latin1.yaml").write_bytes("node_count: 1\ncommand: echo café\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8 .*byte 0xe9 at offset 31"):
        load_job_spec(tmp_path / "latin1.yaml")
    (tmp_path / "big.yaml").write_text("node_count: 1\ncommand: echo\n" + "#" * (1 << 20))
    with pytest.raises(SpecError, match="larger than 1 MiB"):
        load_job_spec(tmp_path / "big.yaml")
    (tmp_path / "inf.yaml").write_text("node_count: 1\ncommand: x\nmax_wall_clock_time: .inf\n")
    with pytest.raises(SpecError, match="max_wall_clock_time: .*finite"):
        load_job_spec(tmp_path / "inf.yaml")
