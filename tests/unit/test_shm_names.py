"""Segment names and the launcher's sweep of a launch's leftovers."""

from __future__ import annotations

import pytest

from ringtrain.shm_names import segment_path, sweep


def test_sweep_removes_only_the_launchs_segments(tmp_path):
    ours = [segment_path("run1", "tok", key, tmp_path) for key in ("s1-r0", "control")]
    theirs = [segment_path("run12", "tok", "s1-r0", tmp_path), tmp_path / "other-file"]
    for path in ours + theirs:
        path.write_bytes(b"x")
    assert sorted(sweep("run1", tmp_path)) == sorted(ours)
    assert all(not p.exists() for p in ours) and all(p.exists() for p in theirs)
    assert sweep("run1", tmp_path) == []
    assert sweep("run1", tmp_path / "missing") == []


def test_names_cannot_leave_the_directory(tmp_path):
    assert segment_path("r", "t", "k", tmp_path) == tmp_path / "ringtrain-r-t-k"
    for bad in ("", "a/b", ".."):
        with pytest.raises(ValueError, match="must be a non-empty file name"):
            segment_path("r", bad, "k", tmp_path)
