"""What a user asks for: the job spec and the cluster spec, validated once at the edge.

A spec file (YAML or JSON) becomes a frozen :class:`JobSpec`; every bad field is reported at once
by :func:`validation_errors` as ``{"field", "message"}`` pairs that both the CLI and the REST API
show as they are.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

from ringtrain.jobs.envvars import PREFIX as RESERVED_ENV_PREFIX
from ringtrain.jobs.errors import SpecError, brief
from ringtrain.jobs.files.safe_open import MAX_NAME_BYTES, MAX_PATH_BYTES
from ringtrain.jobs.models.ids import JOB_ID_RULE, NAME_RULE, Name
from ringtrain.jobs.models.states import Priority

# Names end up in ids, folder names and environment variable names, so they stay simple.
IO_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,62}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A backend's name: ``local`` (the default) or another the service's registry holds.
BACKEND_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
#: Where a backend attached to machines run by someone else finds them: HOST:PORT, a name, or
#: ``local`` (machines the service starts on its own host). No spaces, slashes or ``@``, so no
#: credentials or commands; each backend checks the form it takes.
ADDRESS_PATTERN = r"^[A-Za-z0-9_.:\[\]-]{1,255}$"

# Bounds of a spec: far above any real job, and small enough that the largest spec validates in
# milliseconds (every check below is linear). A spec file or request body holds at most
# MAX_SPEC_BYTES; the kernel's own limits on paths (PATH_MAX, NAME_MAX) bound the paths.
MAX_SPEC_BYTES = 1 << 20
MAX_ENTRIES = 256  # environment variables, inputs, outputs
#: The most bytes one argument or environment entry of exec(2) may hold on Linux
#: (MAX_ARG_STRLEN less the final NUL). A job's command is one argument of `sh -c`.
MAX_ARG_BYTES = 131_071
MAX_ENV_VALUE_CHARS = 64 * 1024
MAX_ERRORS = 20  # reported at once; the rest are counted


def _no_nul(value: str) -> str:
    # A NUL cannot pass through exec, a file name or an environment variable.
    if "\0" in value:
        raise ValueError("must not contain NUL bytes (\\0)")
    return value


def _local_path(value: str) -> str:
    _no_nul(value)
    if "://" in value:  # a URL: handed to the job as it is
        return value
    raw = os.fsencode(value)
    if len(raw) > MAX_PATH_BYTES:
        raise ValueError(f"must be at most {MAX_PATH_BYTES} bytes long (got {len(raw)})")
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > MAX_NAME_BYTES:
        raise ValueError(f"has a component longer than {MAX_NAME_BYTES} bytes ({len(longest)}), "
                         "which no file system accepts")
    return value


IoName = Annotated[str, StringConstraints(pattern=IO_NAME_PATTERN)]
def _fits_exec(value: str) -> str:
    _no_nul(value)
    size = len(value.encode())
    if size > MAX_ARG_BYTES:
        raise ValueError(f"{size} bytes, but the kernel passes at most {MAX_ARG_BYTES} bytes in "
                         "one argument: put a long script in a file of working_dir and run that")
    return value


# Characters are checked first (cheap, and no string of more characters has fewer bytes).
Command = Annotated[str, StringConstraints(max_length=MAX_ARG_BYTES), AfterValidator(_fits_exec)]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ENV_VALUE_CHARS),
                     AfterValidator(_no_nul)]
LocalPath = Annotated[str, StringConstraints(max_length=MAX_PATH_BYTES),
                      AfterValidator(_local_path)]


def _store_url(value: str) -> str:
    _no_nul(value)
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", value):
        raise ValueError("must be a store URL such as s3://bucket/prefix, az://container/path, "
                         "gs://bucket/path or https://host/file")
    return value


StoreUrl = Annotated[str, StringConstraints(max_length=MAX_PATH_BYTES), AfterValidator(_store_url)]


class InputSource(BaseModel):
    """An input in object storage, with how it reaches the ranks (docs/storage.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: StoreUrl = Field(description="az://, s3://, gs:// or https:// URL.")
    mode: Literal["copy", "direct"] = Field(
        "copy", description="copy: staged into each node's cache before the ranks start; "
                            "direct: the URL handed to the script as-is.")
    secret: Name | None = Field(None, description="A named secret holding the credentials.")
    endpoint_url: StoreUrl | None = Field(None, description="S3 only: the endpoint to use.")

    @field_validator("secret")
    @classmethod
    def _secret_copies(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and info.data.get("mode") == "direct":
            raise ValueError("a named secret reaches only the stager; for mode: direct give the "
                             "ranks the store's standard credentials (docs/storage.md)")
        return v


def _input_kind(value: Any) -> str:
    return "source" if isinstance(value, (dict, InputSource)) else "path"


# A path or bare URL, or a mapping: told apart first, so an error speaks of the one meant.
InputValue = Annotated[Annotated[LocalPath, Tag("path")] | Annotated[InputSource, Tag("source")],
                       Discriminator(_input_kind)]


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
    gpus_per_process: int = Field(
        0, ge=0, le=16, strict=True,
        description="GPUs each rank needs. Ray clusters reserve them with the job's nodes and "
                    "give each rank the node's GPUs in CUDA_VISIBLE_DEVICES; local clusters "
                    "leave GPUs to the host.")
    command: Command = Field(min_length=1, description="Shell command each rank runs.")
    working_dir: LocalPath | None = Field(
        None, description="Folder copied into the job's folder at submit time; the ranks' cwd.")
    environment: dict[str, EnvValue] = Field(
        default_factory=dict, max_length=MAX_ENTRIES,
        description="Extra environment variables of every rank.")
    job_preparation: Command | None = Field(
        None, description="Shell command run once per node before the workers start.")
    inputs: dict[IoName, InputValue] = Field(
        default_factory=dict, max_length=MAX_ENTRIES,
        description="Input paths or store URLs (or {url, mode, secret, endpoint_url}), exposed "
                    "as RINGTRAIN_INPUT_<NAME>.")
    outputs: list[IoName] = Field(
        default_factory=list, max_length=MAX_ENTRIES,
        description="Output folders, exposed as RINGTRAIN_OUTPUT_<NAME>.")
    outputs_url: StoreUrl | None = Field(
        None, description="Store URL the outputs are uploaded below ({job_id} is replaced).")
    outputs_secret: Name | None = Field(
        None, description="A named secret holding the credentials of outputs_url.")
    max_wall_clock_time: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="Seconds from start; past it the job is stopped and failed.")
    max_output_files: int | None = Field(
        None, ge=1, le=10**9, strict=True,
        description="Files the job may leave under its outputs; past it the job is stopped and "
                    "failed (default: the service's, see docs/jobs.md).")
    max_output_bytes: int | None = Field(
        None, ge=1, le=2**62, strict=True,
        description="Bytes the job may leave under its outputs; past it the job is stopped and "
                    "failed (default: the service's).")
    max_retries: int = Field(0, ge=0, le=100, strict=True,
                             description="Times a failed job is re-queued.")
    priority: Priority = Field(Priority.NORMAL, description="low | normal | high.")
    min_nodes: int | None = Field(
        None, ge=1, le=1024, strict=True,
        description="Elastic: the job survives losing nodes down to this many (default "
                    "node_count); it fails once fewer remain.")
    max_nodes: int | None = Field(
        None, ge=1, le=1024, strict=True,
        description="Elastic: the job grows up to this many nodes when its cluster has idle "
                    "ones (default node_count).")

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
        if not isinstance(v, dict) or len(v) > MAX_ENTRIES:
            return v  # the field's own validation names the problem
        out = {}
        for key, value in v.items():
            if not isinstance(key, str) or not _matches(ENV_NAME_PATTERN, key):
                raise ValueError(f"{brief(key)} is not a valid variable name (letters, digits, _)")
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{brief(key)}: names starting with {RESERVED_ENV_PREFIX} are set "
                                 "by ringtrain itself")
            if isinstance(value, (bool, int, float)):
                value = str(value).lower() if isinstance(value, bool) else str(value)
            out[key] = value
        return out

    @field_validator("outputs")
    @classmethod
    def _unique_outputs(cls, v: list[str]) -> list[str]:
        dupes = sorted(n for n, count in Counter(v).items() if count > 1)
        if dupes:
            raise ValueError(f"names must be unique; repeated: {', '.join(dupes)}")
        return v

    @field_validator("min_nodes")
    @classmethod
    def _min_nodes_at_most_node_count(cls, v: int | None, info: ValidationInfo) -> int | None:
        count = info.data.get("node_count")
        if v is not None and count is not None and v > count:
            raise ValueError(f"must be at most node_count ({count}): the job starts on "
                             "node_count nodes and may shrink down to min_nodes")
        return v

    @field_validator("max_nodes")
    @classmethod
    def _max_nodes_at_least_node_count(cls, v: int | None, info: ValidationInfo) -> int | None:
        count = info.data.get("node_count")
        if v is not None and count is not None and v < count:
            raise ValueError(f"must be at least node_count ({count}): the job starts on "
                             "node_count nodes and may grow up to max_nodes")
        return v

    @field_validator("outputs_secret")
    @classmethod
    def _secret_has_url(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not info.data.get("outputs_url"):
            raise ValueError("names the credentials of outputs_url, which is not set")
        return v

    def input_sources(self) -> dict[str, InputSource]:
        """Every input that is a store URL, as a source (a bare URL copies)."""
        return {name: value if isinstance(value, InputSource) else InputSource(url=value)
                for name, value in self.inputs.items()
                if isinstance(value, InputSource) or "://" in value}

    def outputs_location(self, job_id: str) -> str | None:
        """``outputs_url`` for job ``job_id``: ``{job_id}`` replaced, one trailing slash."""
        if not self.outputs_url:
            return None
        return self.outputs_url.replace("{job_id}", job_id).rstrip("/") + "/"

    @property
    def elastic(self) -> bool:
        """Whether the job survives losing nodes and grows into idle ones (min_nodes or
        max_nodes given)."""
        return self.min_nodes is not None or self.max_nodes is not None

    @property
    def node_range(self) -> tuple[int, int]:
        """The fewest and the most nodes the job may run on (both node_count unless elastic)."""
        return (self.min_nodes or self.node_count, self.max_nodes or self.node_count)

    @property
    def total_processes(self) -> int:
        """Ranks of the whole job: node_count × process_count_per_node."""
        return self.node_count * self.process_count_per_node


class ClusterSpec(BaseModel):
    """A cluster as requested: N nodes of S process slots each, on one backend.

    ``local`` nodes are process slots on the service's host. A backend attached to machines run
    by someone else (``ray``) finds them at ``address``, where ``nodes`` is how many of them jobs
    may hold at once (0: all) and ``slots`` the CPUs each job may use per node; the backend
    checks the address (:meth:`ClusterBackend.attach`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    nodes: int = Field(ge=0, le=1024, strict=True)
    slots: int = Field(1, ge=1, le=1024, strict=True)
    backend: str = Field("local", pattern=BACKEND_PATTERN,
                         description="`local` (process slots on the service's host) or another "
                                     "backend the service runs (`ray`).")
    address: str | None = Field(
        None, pattern=ADDRESS_PATTERN,
        description="Where an attached backend's machines are (ray: the Ray cluster's GCS "
                    "address host:port, or `local` for a private head started by the service). "
                    "Its token never goes here.")
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
    return re.fullmatch(pattern, value) is not None


_IO_NAME_RULE = "names must start with a letter and contain only letters, digits or '_'"
# What a pattern mismatch means, by the field it is in; any other field holds a name.
_PATTERN_RULES = {"inputs": _IO_NAME_RULE, "outputs": _IO_NAME_RULE, "job_id": JOB_ID_RULE,
                  "backend": "a backend's name: lowercase letters, digits or '_' (local, ray)",
                  "address": "HOST:PORT, or local: letters, digits, '.', '_', '-', ':' or "
                             "brackets, at most 255"}


def validation_errors(err: ValidationError,
                      model: type[BaseModel] = JobSpec) -> list[dict[str, str]]:
    """Turn pydantic's errors into one ``{"field", "message"}`` per problem, saying what is allowed.

    Args:
        err: the error pydantic raised.
        model: the model that was validated, to list its fields for unknown-field errors.
    """
    return field_errors(err.errors(), list(model.model_fields))


def field_errors(errors: Sequence[ErrorDetails], allowed: Sequence[str] = ()
                 ) -> list[dict[str, str]]:
    """Pydantic error details as ``{"field", "message"}`` pairs, at most :data:`MAX_ERRORS` of them.

    Each message says what is allowed and echoes the bad value cut short, so a huge value cannot
    make a huge message; past the limit one last entry counts the errors left out.

    Args:
        errors: pydantic's error details (``ValidationError.errors()``), locations as they should
            be shown.
        allowed: the fields of the validated model, named in unknown-field errors.
    """
    out = []
    named = False
    for e in errors[:MAX_ERRORS]:
        loc = e["loc"]
        if len(loc) > 2 and loc[0] == "inputs" and loc[2] in ("path", "source"):
            loc = (*loc[:2], *loc[3:])  # the union's tags say nothing to a user
        field = ".".join(str(p) for p in loc) or "(spec)"
        kind = e["type"]
        if kind == "extra_forbidden":
            message = "unknown field"
            if allowed and not named:  # listed once, not once per unknown field
                message += f"; allowed fields: {', '.join(allowed)}"
                named = True
        elif kind == "string_pattern_mismatch":
            message = _PATTERN_RULES.get(str(e["loc"][0]), NAME_RULE)
        else:
            message = e["msg"].removeprefix("Value error, ")
        if kind not in ("missing", "extra_forbidden"):
            message += f" (got {brief(e['input'])})"
        out.append({"field": field, "message": message})
    if len(errors) > MAX_ERRORS:
        out.append({"field": "(spec)",
                    "message": f"... and {len(errors) - MAX_ERRORS} more errors"})
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


def expand_path(value: str) -> Path:
    """A spec's path as this host sees it: ``~`` expanded, absolute, symbolic links resolved.

    Raises:
        ValueError: ``~user`` names no user, or the path loops through symbolic links; the
            message says which.
    """
    try:
        return Path(value).expanduser().resolve()
    except (OSError, RuntimeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise ValueError(f"cannot use {brief(value)}: {reason}") from None
