"""Request and response bodies of the Open Inference Protocol (KServe v2) routes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class TensorInput(BaseModel):
    """One input tensor: ``data`` in row-major order, flat or nested, or raw bytes after the JSON
    (``parameters.binary_data_size``, see :mod:`ringtrain.serve.tensors`)."""

    name: str = Field(max_length=256)
    shape: list[int] = Field(min_length=1, max_length=8)
    datatype: str = Field(max_length=16, description="FP32 (FP64 and FP16 are converted)")
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class InferRequest(BaseModel):
    """``POST /v2/models/{name}/infer``."""

    id: str | None = Field(None, max_length=256)
    inputs: list[TensorInput] = Field(min_length=1)
    outputs: list[dict[str, Any]] | None = None
    parameters: dict[str, Any] | None = None


class TensorOutput(BaseModel):
    """One output tensor, flat row-major ``data``, or raw bytes after the JSON of a binary
    answer (``parameters.binary_data_size``)."""

    name: str
    shape: list[int]
    datatype: str
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class InferResponse(BaseModel):
    """The answer to an inference request."""

    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[TensorOutput]


class TensorSpec(BaseModel):
    """An input or output as the model's metadata describes it (``-1``: any size)."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """``GET /v2/models/{name}``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    task: str
    classes: list[str]


class ErrorBody(BaseModel):
    """Every error: ``error`` as the protocol names it, ``detail`` as FastAPI does."""

    error: str
    detail: str
