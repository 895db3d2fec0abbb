"""Scalars from TensorBoard event files, read with the standard library as they grow.

An event file is a sequence of TFRecords (``uint64 length``, ``uint32`` masked CRC-32C of the
length, the payload, ``uint32`` masked CRC of the payload), each payload a serialized ``Event``
protocol buffer. Only the fields scalars need are decoded, by hand:

- ``Event``: ``wall_time`` (1, double), ``step`` (2, int64), ``summary`` (5).
- ``Summary``: repeated ``value`` (1); ``Value``: ``tag`` (1), ``simple_value`` (2, float; what
  ``torch.utils.tensorboard`` writes) or ``tensor`` (8; what TF2 and Keras write), whose
  ``dtype`` (1), ``tensor_content`` (4) and ``float_val`` / ``double_val`` / ``int_val`` /
  ``int64_val`` (5, 6, 7, 10) hold one number for a scalar.

A record is consumed only once it is complete, so a file read while its writer appends to it
yields each scalar exactly once. The length's CRC is checked (a torn or foreign file stops
there); the payload's is not: the bytes come from the job's own writer, and a pure-Python
CRC-32C of every image summary would cost more than the whole read.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ringtrain.errors import RingtrainError
from ringtrain.jobs.files.safe_open import open_regular

#: The most bytes one read takes from a file; the rest waits for the next read.
READ_LIMIT = 8 * 1024 * 1024
#: A record claiming more than this is not one a scalar writer produced: the file is dropped.
MAX_RECORD = 256 * 1024 * 1024

_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 1, 2, 3, 9
_CONTENT_FORMATS = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q"}


@dataclass(frozen=True)
class Scalar:
    """One logged value."""

    tag: str
    step: int
    wall_time: float
    value: float


class CorruptEventFile(ValueError):
    """The bytes read are not TFRecords."""


class EventFileReader:
    """Reads one event file incrementally: each :meth:`read` returns the scalars appended since.

    ``opener`` opens it: the one safe open (no link, no pipe), from the file's own folder by
    default; a job's folder passes one from the job's folder, which checks every component below.
    """

    def __init__(self, path: Path, opener: Callable[[], int] | None = None):
        self.path = path
        self._open = opener or partial(open_regular, path.parent, path.name)
        self.offset = 0
        self.broken: str | None = None  # why reading stopped for good

    def read(self) -> list[Scalar]:
        """The scalars of the complete records written since the last call.

        An unreadable file yields nothing now (it is tried again next time); a corrupt one
        yields nothing from then on, and :attr:`broken` says why.
        """
        if self.broken is not None:
            return []
        try:
            fd = self._open()
        except (OSError, RingtrainError):
            return []
        try:
            data = os.pread(fd, READ_LIMIT, self.offset)
        except OSError:
            return []
        finally:
            os.close(fd)
        try:
            records, used = split_records(data)
        except CorruptEventFile as e:
            self.broken = str(e)
            return []
        self.offset += used
        out: list[Scalar] = []
        for payload in records:
            try:
                out.extend(parse_event(payload))
            except (IndexError, struct.error, UnicodeDecodeError, ValueError):
                continue  # one record we cannot decode; the framing still holds
        return out


def split_records(data: bytes) -> tuple[list[bytes], int]:
    """The complete TFRecord payloads at the start of ``data`` and the bytes they span. Raises
    CorruptEventFile for a length whose CRC does not match, or an absurd length."""
    records, pos = [], 0
    while pos + 12 <= len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked_crc32c(header):
            raise CorruptEventFile(f"bad record length checksum at byte {pos}")
        if length > MAX_RECORD:
            raise CorruptEventFile(f"a record of {length} bytes at byte {pos}")
        end = pos + 12 + length + 4
        if end > len(data):
            break  # the writer has not finished this one
        records.append(data[pos + 12:pos + 12 + length])
        pos = end
    return records, pos


def parse_event(payload: bytes) -> list[Scalar]:
    """The scalars of one serialized ``Event`` (none for other kinds of events)."""
    wall_time, step, summary = 0.0, 0, None
    for field, _, value in _fields(payload):
        if field == 1 and isinstance(value, bytes) and len(value) == 8:
            (wall_time,) = struct.unpack("<d", value)
        elif field == 2 and isinstance(value, int):
            step = _signed64(value)
        elif field == 5 and isinstance(value, bytes):
            summary = value
    if summary is None:
        return []
    out = []
    for field, _, value in _fields(summary):
        if field == 1 and isinstance(value, bytes):
            parsed = _summary_value(value)
            if parsed is not None:
                out.append(Scalar(parsed[0], step, wall_time, parsed[1]))
    return out


def _summary_value(data: bytes) -> tuple[str, float] | None:
    tag, number = "", None
    for field, wire, value in _fields(data):
        if field == 1 and isinstance(value, bytes):
            tag = value.decode()
        elif field == 2 and wire == 5 and isinstance(value, bytes):
            (number,) = struct.unpack("<f", value)
        elif field == 8 and isinstance(value, bytes):
            number = _tensor_scalar(value)
    return None if number is None or not tag else (tag, float(number))


def _tensor_scalar(data: bytes) -> float | None:
    """The one number of a numeric ``TensorProto``, or ``None`` (strings, histograms, ...)."""
    dtype, content, values = 0, b"", []
    for field, wire, value in _fields(data):
        if field == 1 and isinstance(value, int):
            dtype = value
        elif field == 4 and isinstance(value, bytes):
            content = value
        elif field in (5, 6) and isinstance(value, bytes):
            fmt = "<f" if field == 5 else "<d"
            size = struct.calcsize(fmt)
            if wire == 2:  # packed
                values += [struct.unpack_from(fmt, value, i)[0]
                           for i in range(0, len(value) - size + 1, size)]
            else:
                values.append(struct.unpack(fmt, value)[0])
        elif field in (7, 10):
            if isinstance(value, int):
                values.append(_signed64(value))
            else:  # packed varints
                values += [_signed64(v) for v in _varints(value)]
    if content and dtype in _CONTENT_FORMATS:
        fmt = _CONTENT_FORMATS[dtype]
        if len(content) == struct.calcsize(fmt):
            return float(struct.unpack(fmt, content)[0])
        return None
    return float(values[0]) if len(values) == 1 else None


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """The ``(field number, wire type, value)`` of one message; varints as ints, the rest as
    bytes (fixed64 and fixed32 raw, length-delimited unparsed)."""
    out: list[tuple[int, int, int | bytes]] = []
    pos, n = 0, len(data)
    while pos < n:
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((field, wire, value))
        elif wire == 1:
            out.append((field, wire, data[pos:pos + 8]))
            pos += 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            out.append((field, wire, data[pos:pos + length]))
            pos += length
        elif wire == 5:
            out.append((field, wire, data[pos:pos + 4]))
            pos += 4
        else:
            raise ValueError(f"wire type {wire} at byte {pos}")
        if pos > n:
            raise ValueError("a field runs past the end of its message")
    return out


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _varints(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        value, pos = _varint(data, pos)
        out.append(value)
    return out


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE: list[int] = []


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of ``data``."""
    if not _TABLE:
        _TABLE.extend(_crc32c_table())
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
