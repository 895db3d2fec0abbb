"""Request and response bodies of the REST API, shared by the server and the client."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ringtrain.jobs.models import JobSpec
from ringtrain.jobs.models.deployment import MAX_REPLICAS, MAX_RESTARTS
from ringtrain.jobs.models.ids import Name
from ringtrain.jobs.replica_record import DEFAULT_MAX_RESTARTS

API_PREFIX = "/v1"
#: What a client may use as the ``Idempotency-Key`` header of ``POST /v1/jobs``.
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
#: The same rule in words, for error messages and docs.
IDEMPOTENCY_KEY_RULE = "1 to 128 characters among A-Z a-z 0-9 . _ : -"


class ResizeRequest(BaseModel):
    """``PATCH /v1/clusters/{name}``: the new number of nodes and/or of slots per node."""

    model_config = ConfigDict(extra="forbid")

    nodes: int | None = Field(None, ge=0, le=1024, strict=True)
    slots: int | None = Field(None, ge=1, le=1024, strict=True)


class SubmitRequest(BaseModel):
    """``POST /v1/jobs``: a spec and the cluster to run it on."""

    model_config = ConfigDict(extra="forbid")

    cluster: Name
    spec: JobSpec


class DeployRequest(BaseModel):
    """``POST /v1/jobs/{id}/deploy``: how many servers, and where (default: the job's cluster);
    the ports of the front and of the replicas (replica K on ``replica_port + K``; 0: free
    ones), and how many restarts in a row each replica may make."""

    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, strict=True)
    cluster: Name | None = None
    port: int = Field(0, strict=True)
    replica_port: int = Field(0, strict=True)
    max_restarts: int = Field(DEFAULT_MAX_RESTARTS, ge=0, le=MAX_RESTARTS, strict=True)


class FieldError(BaseModel):
    """One bad field of a request."""

    field: str
    message: str


class ErrorResponse(BaseModel):
    """Every error the API returns: a message to show, and the bad fields of an invalid spec."""

    detail: str
    errors: list[FieldError] = Field(default_factory=list)


class DiskSpace(BaseModel):
    """The free space of the disk the service has least room on (its home's, or its share's).

    New jobs are refused while ``below_floor``: free space under ``floor_bytes``."""

    path: str
    free_bytes: int
    total_bytes: int
    floor_bytes: int
    below_floor: bool


class Health(BaseModel):
    """``GET /v1/health``: who answers, and the free space of its disk (``None`` until the
    service first measured it)."""

    status: str = "ok"
    pid: int
    home: str
    version: str
    disk: DiskSpace | None = None


class LoginCode(BaseModel):
    """``POST /v1/dashboard/login-codes``: a single-use code that signs a browser in."""

    code: str
    url_path: str = Field(description="Where the browser goes: the path with the code, "
                                      "relative to the server's address.")
    expires_in_s: float
