"""Test tiers by cost.

``fast``: pure logic and in-process tests (no child process, no Ray, no training run; a server
in a thread of the test process is fine): every test under ``tests/unit`` and ``tests/engine``
(engines as threads of one process), and the tests of any module that declares
``pytestmark = pytest.mark.fast``. ``bash scripts/test.sh --fast``
runs this tier (under two minutes on a 2-core machine); the full suite runs everything.

With ``-m fast`` exactly (what ``scripts/test.sh --fast`` passes), a test module elsewhere that
never says ``mark.fast`` is not even imported: collecting it only to deselect its tests took
~7 s more (18 s instead of 11 s on a 2-core machine at load 3.5: their dependencies' imports
and pytest's rewrite of their asserts).

The whole suite runs in pytest-xdist workers that take whole modules in collection order, so the
longest modules (:data:`LONGEST_FIRST`, from ``--durations``) are moved to the front: started
last, one of them kept a worker busy minutes after the other had run out of work.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_FAST_DIRS = ("unit", "engine")
_TESTS = Path(__file__).parent
#: The longest modules, longest first (2-core machine, whole suite, 2026-11-29).
LONGEST_FIRST = ("jobs/test_ray_backend.py", "integration/test_doctor.py",
                 "storage/test_storage_jobs.py", "integration/test_doctor_wrapped_steps.py",
                 "integration/test_keras_example.py", "integration/test_ssh_launch.py",
                 "multiproc/test_shm.py", "integration/test_node_launch.py",
                 "integration/test_examples.py", "integration/test_readme_walk.py",
                 "multiproc/test_no_hang.py", "jobs/test_attempts.py",
                 "integration/test_elastic_one_rank.py")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip, under ``-m fast``, a test module outside the fast folders that marks nothing
    ``fast`` (``None``: pytest's own rules decide)."""
    if config.getoption("markexpr", "") != "fast" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    try:
        tier = collection_path.relative_to(_TESTS).parts[0]
    except ValueError:
        return None
    if tier in _FAST_DIRS or "mark.fast" in collection_path.read_text(encoding="utf-8"):
        return None
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            tier = Path(str(item.path)).relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        if tier in _FAST_DIRS:
            item.add_marker(pytest.mark.fast)
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> int:
        try:
            return rank.get(Path(str(item.path)).relative_to(_TESTS).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=order)  # stable: the others keep their order, each module stays together
