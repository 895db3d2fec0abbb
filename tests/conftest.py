"""Test tiers by cost.

``fast``: pure logic and in-process tests (no child process, no Ray, no training run; a server
in a thread of the test process is fine): every test under ``tests/unit`` and ``tests/engine``
(engines as threads of one process), and the tests of any module that declares
``pytestmark = pytest.mark.fast``. ``bash scripts/test.sh --fast``
runs this tier (under two minutes on a 2-core machine); the full suite runs everything.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_FAST_DIRS = ("unit", "engine")
_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(str(item.path)).relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        if tier in _FAST_DIRS:
            item.add_marker(pytest.mark.fast)
