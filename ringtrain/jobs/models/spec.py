"""What a user asks for: the job spec and the cluster spec, validated once at the edge.

A spec file (YAML or JSON) becomes a frozen :class:`JobSpec`; every bad field is reported at once
by :func:`validation_errors` as ``{"field", "message"}`` pairs that both the CLI and the REST API
show as they are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ringtrain.jobs.envvars import PREFIX as RESERVED_ENV_PREFIX
from ringtrain.jobs.errors import SpecError
from ringtrain.jobs.models.states import Priority

# Names end up in ids, folder names and environment variable names, so they stay simple.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
IO_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,62}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
IoName = Annotated[str, StringConstraints(pattern=IO_NAME_PATTERN)]


class JobSpec(BaseModel):
    """A training job as requested: what to run, on how many nodes, with which files.

    Unknown fields are refused so that a typo (``node_cout``) is an error, not a silent default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name | None = Field(None, description="A label; the job id is generated from it.")
    experiment: Name | None = Field(None, description="Groups jobs in `job list --experiment`.")
    node_count: int = Field(ge=1, le=1024, strict=True, description="Nodes the job needs (gang).")
    process_count_per_node: int = Field(
        1, ge=1, le=1024, strict=True, description="Worker processes (ranks) per node.")
    command: str = Field(min_length=1, description="Shell command each rank runs.")
    working_dir: str | None = Field(
        None, description="Folder copied into the job's folder at submit time; the ranks' cwd.")
    environment: dict[str, str] = Field(
        default_factory=dict, description="Extra environment variables of every rank.")
    job_preparation: str | None = Field(
        None, description="Shell command run once per node before the workers start.")
    inputs: dict[IoName, str] = Field(
        default_factory=dict, description="Input paths, exposed as RINGTRAIN_INPUT_<NAME>.")
    outputs: list[IoName] = Field(
        default_factory=list, description="Output folders, exposed as RINGTRAIN_OUTPUT_<NAME>.")
    max_wall_clock_time: float | None = Field(
        None, gt=0, description="Seconds from start; past it the job is stopped and failed.")
    max_retries: int = Field(0, ge=0, le=100, strict=True,
                             description="Times a failed job is re-queued.")
    priority: Priority = Field(Priority.NORMAL, description="low | normal | high.")

    @field_validator("command")
    @classmethod
    def _command_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("environment", mode="before")
    @classmethod
    def _environment(cls, v: Any) -> Any:
        # YAML turns `EPOCHS: 1` into an int; environment values are strings, so scalars convert.
        if not isinstance(v, dict):
            return v
        out = {}
        for key, value in v.items():
            if not isinstance(key, str) or not _matches(ENV_NAME_PATTERN, key):
                raise ValueError(f"{key!r} is not a valid variable name (letters, digits, _)")
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{key!r}: names starting with {RESERVED_ENV_PREFIX} are set by "
                                 "ringtrain itself")
            if isinstance(value, (bool, int, float)):
                value = str(value).lower() if isinstance(value, bool) else str(value)
            out[key] = value
        return out

    @field_validator("outputs")
    @classmethod
    def _unique_outputs(cls, v: list[str]) -> list[str]:
        dupes = sorted({n for n in v if v.count(n) > 1})
        if dupes:
            raise ValueError(f"names must be unique; repeated: {', '.join(dupes)}")
        return v

    @property
    def total_processes(self) -> int:
        """Ranks of the whole job: node_count × process_count_per_node."""
        return self.node_count * self.process_count_per_node


class ClusterSpec(BaseModel):
    """A cluster as requested: N nodes of S process slots each, on one backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    nodes: int = Field(ge=0, le=1024, strict=True)
    slots: int = Field(1, ge=1, le=1024, strict=True)
    backend: str = Field("local", pattern=r"^local$", description="Only `local` so far.")
    max_nodes: int | None = Field(
        None, ge=0, le=1024, strict=True,
        description="The most nodes a resize may set; jobs needing more are refused at submit.")

    @field_validator("max_nodes")
    @classmethod
    def _max_nodes_at_least_nodes(cls, v: int | None, info: ValidationInfo) -> int | None:
        nodes = info.data.get("nodes")
        if v is not None and nodes is not None and v < nodes:
            raise ValueError(f"must be at least nodes ({nodes})")
        return v


def _matches(pattern: str, value: str) -> bool:
    return re.match(pattern, value) is not None


_HINTS = {
    "string_pattern_mismatch": "must start with a letter or digit and contain only letters, "
                               "digits, '.', '_' or '-' (at most 63 characters)",
}


def validation_errors(err: ValidationError, model: type[BaseModel] = JobSpec) -> list[dict[str, str]]:
    """Turn pydantic's errors into one ``{"field", "message"}`` per problem, saying what is allowed.

    Args:
        err: the error pydantic raised.
        model: the model that was validated, to list its fields for unknown-field errors.
    """
    out = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(spec)"
        kind = e["type"]
        if kind == "extra_forbidden":
            message = f"unknown field; allowed fields: {', '.join(model.model_fields)}"
        elif kind == "string_pattern_mismatch" and e["loc"][0] in ("inputs", "outputs"):
            message = "names must start with a letter and contain only letters, digits or '_'"
        else:
            message = _HINTS.get(kind, e["msg"].removeprefix("Value error, "))
        if kind != "missing" and kind != "extra_forbidden":
            message += f" (got {e['input']!r})"
        out.append({"field": field, "message": message})
    return out


def parse_job_spec(data: Any, source: str = "job spec") -> JobSpec:
    """Validate a decoded spec document.

    Raises:
        SpecError: with every bad field named.
    """
    if not isinstance(data, dict):
        raise SpecError([{"field": "(spec)", "message": "must be a mapping of fields to values"}],
                        source)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(validation_errors(e), source) from None


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML or JSON spec file (JSON is YAML, so one parser reads both).

    Raises:
        SpecError: the file is unreadable, not YAML/JSON, or has bad fields.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError([{"field": "(file)", "message": f"cannot read {path}: {e.strerror}"}],
                        f"job spec {path}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as e:
        raise SpecError([{"field": "(file)", "message": f"not valid YAML/JSON: {e}"}],
                        f"job spec {path}") from None
    return parse_job_spec(data, f"job spec {path}")
