import pytest

from tests.multiproc.world import World

_worlds: dict[int, World] = {}


def _world(size: int) -> World:
    world = _worlds.get(size)
    if world is None or not world.alive:
        world = _worlds[size] = World(size)
    return world


@pytest.fixture(params=[2, 3], ids=["np2", "np3"])
def world(request) -> World:
    """A 2- or 3-rank world (odd sizes catch ring bugs), shared by the tests of the session."""
    return _world(request.param)


@pytest.fixture
def world2() -> World:
    return _world(2)


@pytest.fixture
def world3() -> World:
    """A world with a rank outside any two-rank process set."""
    return _world(3)


def pytest_sessionfinish(session, exitstatus):
    for w in _worlds.values():
        w.close()
