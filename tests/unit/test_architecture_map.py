"""docs/architecture.md's layout block names every package and module of ``ringtrain``, and the
rules under it speak of every layer ``test_layering`` enforces: a map that leaves out a part of
the code, or names one that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import ringtrain

ROOT = Path(ringtrain.__file__).parent
MAP = ROOT.parent / "docs" / "architecture.md"


def _layout_block() -> str:
    text = MAP.read_text()
    after = text.split("\n## Layout\n", 1)[1]
    return after.split("```\n", 2)[1]


def _packages() -> set[str]:
    """Every package below ``ringtrain/`` as a path (``jobs/api``), the horovod shim's data
    excluded (it is package data, not a package of ringtrain)."""
    return {str(p.parent.relative_to(ROOT)) for p in ROOT.rglob("__init__.py")
            if p.parent != ROOT and "shim" not in p.relative_to(ROOT).parts}


def test_the_layout_names_every_package() -> None:
    block = _layout_block()
    named = set(re.findall(r"([a-z_]+)/", block))
    missing = {p for p in _packages() if p.rsplit("/", 1)[-1] not in named}
    assert not missing, f"docs/architecture.md's layout does not name: {sorted(missing)}"


def test_the_layout_names_every_top_level_module_and_nothing_that_is_gone() -> None:
    block = _layout_block()
    listed = set(re.findall(r"^  ([a-z_]+\.py)\b", block, flags=re.M))
    top = {p.name for p in ROOT.glob("*.py")}
    assert top <= listed, f"not in the layout: {sorted(top - listed)}"
    assert listed <= top, f"in the layout but not in ringtrain/: {sorted(listed - top)}"
    packages = set(re.findall(r"^  ([a-z_]+)/", block, flags=re.M))
    real = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert packages == real, (sorted(packages - real), sorted(real - packages))


def test_the_layout_names_every_module() -> None:
    words = set(re.findall(r"[A-Za-z_]+", _layout_block()))
    modules = [p for p in ROOT.rglob("*.py") if "shim" not in p.relative_to(ROOT).parts
               and p.name not in ("__init__.py", "__main__.py")]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if p.stem not in words)
    assert not missing, f"docs/architecture.md's layout does not name: {missing}"


def test_the_rules_speak_of_every_layer_the_layering_test_enforces() -> None:
    from tests.unit.test_layering import ALLOWED

    rules = MAP.read_text().split("\n## Layout\n", 1)[1].split("```\n", 2)[2]
    rules = rules.split("\n## ", 1)[0]
    packages = {unit.split(".")[0] for unit in ALLOWED} - {"leaf"}
    unnamed = sorted(p for p in packages if f"`{p}/" not in rules and f"`{p}" not in rules)
    assert not unnamed, f"docs/architecture.md's rules say nothing of: {unnamed}"
