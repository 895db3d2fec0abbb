"""A reader of the IDX file format (LeCun's MNIST format), plain or gzip-compressed.

An IDX file is a big-endian header -- two zero bytes, a type code, the number of dimensions, then
one 32-bit size per dimension -- followed by the data in C order. Only unsigned bytes (type 0x08)
are supported: every image/label set in this format that ringtrain reads uses them.
"""

from __future__ import annotations

import gzip
import math
import struct
from pathlib import Path

import torch

from ringtrain.errors import RingtrainError

_UBYTE = 0x08


class DatasetFileError(RingtrainError, OSError):
    """A data set file is missing, unreadable or not what its name promises."""


def read_idx(path: str | Path, *, ndim: int, hint: str = "") -> torch.Tensor:
    """Read an IDX file of unsigned bytes (``.gz``: decompressed) into a ``torch.uint8`` tensor
    of the shape its header records, which must have ``ndim`` dimensions (3 for images, 1 for
    labels); ``hint``, what the user can do about a bad file, ends each error message.

    Raises:
        DatasetFileError: The file is missing or unreadable, its header is not an IDX header of
            unsigned bytes with ``ndim`` dimensions, or its data is shorter or longer than the
            header says.
    """
    path = Path(path)
    suffix = f" ({hint})" if hint else ""
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = f.read()
    except FileNotFoundError:
        raise DatasetFileError(f"{path}: no such file{suffix}") from None
    # gzip reports a truncated or corrupt stream as EOFError or BadGzipFile (an OSError).
    except (OSError, EOFError) as e:
        raise DatasetFileError(f"{path}: cannot read: {e}{suffix}") from e

    if len(raw) < 4:
        raise DatasetFileError(f"{path}: {len(raw)} bytes is too short for an IDX header{suffix}")
    zero, dtype_code, file_ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != _UBYTE or file_ndim != ndim:
        magic = int.from_bytes(raw[:4], "big")
        expected = (_UBYTE << 8) | ndim
        raise DatasetFileError(
            f"{path}: magic number 0x{magic:08x}, expected 0x{expected:08x} (IDX, unsigned "
            f"bytes, {ndim} dimensions){suffix}"
        )
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DatasetFileError(f"{path}: header truncated{suffix}")
    shape = struct.unpack(f">{ndim}I", raw[4:header_len])
    expected_len = header_len + math.prod(shape)
    if len(raw) != expected_len:
        raise DatasetFileError(
            f"{path}: header says shape {tuple(shape)} ({expected_len} bytes with the header) "
            f"but the file has {len(raw)} bytes{suffix}"
        )
    if expected_len == header_len:  # torch.frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=torch.uint8)
    # bytearray makes the buffer writable, which torch.frombuffer wants; it is the only copy.
    data = torch.frombuffer(bytearray(raw[header_len:]), dtype=torch.uint8)
    return data.reshape(shape)
