"""Request tensors in and answer tensors out: JSON ``data``, or KServe v2's binary extension.

In JSON an input's ``data`` holds its numbers, flat or nested, in row-major order. With the
binary tensor data extension a request whose ``Inference-Header-Content-Length`` header says
``N`` holds N bytes of the usual inference JSON, then the raw little-endian bytes of each input
that declares ``"parameters": {"binary_data_size": B}`` (in input order) instead of ``data``. An
answer is sent the same way when the request asks for it (``"parameters":
{"binary_data_output": true}``, or ``"binary_data": true`` on a requested output), as Triton's
and KServe's clients do. It spares the server from parsing and printing numbers as text.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ringtrain.serve.predictor import InputError
from ringtrain.serve.schemas import InferRequest, TensorInput

#: The header that gives the length of the JSON part.
HEADER_LENGTH = "inference-header-content-length"
#: Input datatypes, converted to the model's float32; outputs are FP32 or INT64.
INPUT_DTYPES = {"FP32": torch.float32, "FP64": torch.float64, "FP16": torch.float16}
OUTPUT_DTYPES = {"FP32": torch.float32, "INT64": torch.int64}


def _input_dtype(spec: TensorInput) -> torch.dtype:
    """The dtype of an input, whose shape has no negative size.

    Raises:
        InputError: The datatype is not a float one, or a size is negative.
    """
    dtype = INPUT_DTYPES.get(spec.datatype)
    if dtype is None:
        raise InputError(f"input {spec.name!r} has datatype {spec.datatype}; the model takes "
                         "FP32 (FP64 and FP16 are converted)")
    if any(d < 0 for d in spec.shape):
        raise InputError(f"input {spec.name!r} has shape {spec.shape}: sizes must be 0 or more")
    return dtype


def json_tensor(spec: TensorInput) -> torch.Tensor:
    """An input given as JSON ``data``, as float32 of its declared shape.

    Raises:
        InputError: A bad datatype or shape, or data that are not numbers filling the shape.
    """
    _input_dtype(spec)
    try:
        tensor = torch.tensor(spec.data, dtype=torch.float32).flatten()
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"input {spec.name!r}: data must be numbers in nested lists of equal "
                         f"length ({e})") from None
    if tensor.numel() != math.prod(spec.shape):
        raise InputError(f"input {spec.name!r}: shape {spec.shape} needs "
                         f"{math.prod(spec.shape)} values, data has {tensor.numel()}")
    return tensor.reshape(spec.shape)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON part of a request body and the raw tensor bytes after it.

    Raises:
        InputError: The header is not a length within the body.
    """
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 < n <= len(body):
        raise InputError(f"Inference-Header-Content-Length {header_length!r} must be the length "
                         f"of the JSON part, between 1 and the body's {len(body)} bytes")
    return body[:n], body[n:]


def binary_sizes(request: InferRequest) -> list[int | None]:
    """Each input's ``binary_data_size``, or ``None`` for an input given as JSON ``data``.

    Raises:
        InputError: A size is not a non-negative integer, an input has both or neither.
    """
    sizes: list[int | None] = []
    for spec in request.inputs:
        size = (spec.parameters or {}).get("binary_data_size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise InputError(f"input {spec.name!r}: binary_data_size must be a byte count")
        if (size is None) == (spec.data is None):
            raise InputError(f"input {spec.name!r} needs either data or a binary_data_size "
                             "(with Inference-Header-Content-Length), and not both")
        sizes.append(size)
    return sizes


def input_tensor(spec: TensorInput, raw: bytes) -> torch.Tensor:
    """An input sent as raw bytes, as float32 of its declared shape.

    Raises:
        InputError: A bad datatype or shape, or bytes that do not fill the shape.
    """
    dtype = _input_dtype(spec)
    want = math.prod(spec.shape) * dtype.itemsize
    if len(raw) != want:
        raise InputError(f"input {spec.name!r}: shape {spec.shape} of {spec.datatype} needs "
                         f"{want} bytes, binary_data_size gives {len(raw)}")
    if not raw:
        return torch.empty(spec.shape)
    return torch.frombuffer(bytearray(raw), dtype=dtype).to(torch.float32).reshape(spec.shape)


def wants_binary_output(request: InferRequest) -> bool:
    """Whether the client asked for the outputs as raw bytes."""
    if (request.parameters or {}).get("binary_data_output") is True:
        return True
    return any((o.get("parameters") or {}).get("binary_data") is True
               for o in request.outputs or [])


def output_parts(tensors: list[tuple[str, str, torch.Tensor]], binary: bool
                 ) -> tuple[list[dict[str, Any]], bytes]:
    """The JSON entries of the ``(name, datatype, tensor)`` outputs and, for a ``binary`` answer
    (raw bytes, ``parameters.binary_data_size``, instead of ``data``), the bytes after the JSON."""
    entries, chunks = [], []
    for name, datatype, tensor in tensors:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(tensor.shape)}
        if binary:
            raw = tensor.to(OUTPUT_DTYPES[datatype]).contiguous().numpy().tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = tensor.flatten().tolist()
        entries.append(entry)
    return entries, b"".join(chunks)
