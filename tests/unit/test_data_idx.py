"""The IDX reader on hand-made files: good ones, and each way a file can be wrong."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
import torch

from ringtrain.data.idx import DatasetFileError, read_idx


def _idx(shape: tuple[int, ...], data: bytes, *, type_code: int = 0x08) -> bytes:
    return struct.pack(f">HBB{len(shape)}I", 0, type_code, len(shape), *shape) + data


def test_reads_plain_and_gzip_files(tmp_path: Path) -> None:
    payload = bytes(range(24))
    (tmp_path / "a").write_bytes(_idx((2, 3, 4), payload))
    with gzip.open(tmp_path / "a.gz", "wb") as f:
        f.write(_idx((2, 3, 4), payload))
    for name in ("a", "a.gz"):
        t = read_idx(tmp_path / name, ndim=3)
        assert t.dtype == torch.uint8
        assert t.shape == (2, 3, 4)
        assert t.flatten().tolist() == list(payload)


def test_empty_data_gives_an_empty_tensor(tmp_path: Path) -> None:
    (tmp_path / "e").write_bytes(_idx((0,), b""))
    assert read_idx(tmp_path / "e", ndim=1).shape == (0,)


def test_missing_file_names_it_and_the_hint(tmp_path: Path) -> None:
    with pytest.raises(DatasetFileError, match=r"nothere\.gz: no such file \(install me\)"):
        read_idx(tmp_path / "nothere.gz", ndim=1, hint="install me")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x00\x00", "too short"),
        (_idx((3,), b"abc", type_code=0x0D), "magic number 0x00000d01, expected 0x00000801"),
        (_idx((3, 1), b"abc"), "expected 0x00000801"),
        (b"\x00\x00\x08\x01\x00", "header truncated"),
        (_idx((4,), b"abc"), r"shape \(4,\) .* has 11 bytes"),
        (_idx((2,), b"abc"), r"shape \(2,\) .* has 11 bytes"),
    ],
    ids=["short", "float-type", "wrong-ndim", "cut-header", "cut-data", "extra-data"],
)
def test_corrupt_files_are_refused_with_the_reason(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "labels"
    path.write_bytes(content)
    with pytest.raises(DatasetFileError, match=message) as info:
        read_idx(path, ndim=1)
    assert str(path) in str(info.value)


def test_truncated_gzip_is_a_dataset_error(tmp_path: Path) -> None:
    good = gzip.compress(_idx((100,), bytes(100)))
    (tmp_path / "cut.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "notgz.gz").write_bytes(b"plain bytes, not gzip")
    for name in ("cut.gz", "notgz.gz"):
        with pytest.raises(DatasetFileError, match="cannot read"):
            read_idx(tmp_path / name, ndim=1)
