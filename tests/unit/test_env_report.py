"""`ringtrain env`: Horovod's variables and ringtrain's apart (no token), torchvision's version."""

from __future__ import annotations

import os

from ringtrain.env_report import collect


def test_variables_are_labelled_by_owner_and_torchvision_is_listed(monkeypatch):
    for name in list(os.environ):  # the environment the suite runs in may set some
        if name.startswith(("RINGTRAIN_", "HOROVOD_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RINGTRAIN_HOME", "/tmp/home")
    monkeypatch.setenv("RINGTRAIN_TOKEN", "secret")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1024")
    info = collect()
    assert info["horovod_variables"] == {"HOROVOD_FUSION_THRESHOLD": "1024"}
    assert info["ringtrain_variables"] == {"RINGTRAIN_HOME": "/tmp/home"}
    assert "torchvision" in info and "secret" not in str(info)
