"""One SeaweedFS and one Azurite per test module that asks for them: ``store`` runs a test on
both."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.storage.servers import Store, start_azurite, start_seaweed


@pytest.fixture(scope="module", params=["seaweedfs", "azurite"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Store]:
    folder = tmp_path_factory.mktemp(request.param)
    running = start_seaweed(folder) if request.param == "seaweedfs" else start_azurite(folder)
    yield running
    running.stop()
