"""One SeaweedFS and one Azurite per test module that asks for them: ``store`` runs a test on
both, except where :data:`QUALITY_ONLY` leaves a store's run to the quality tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.storage.servers import Store, start_azurite, start_seaweed

#: Store runs of a whole job's path that only the quality tier makes (`scripts/test.sh
#: --quality`): the suite runs that path on Azurite, and the S3 parts it goes through (staging,
#: uploads in parts, resuming, credentials) on SeaweedFS in test_node_cache.py; the S3 run of the
#: whole path took 42-55 s of the suite's CPU-bound 20 minutes.
QUALITY_ONLY = {("test_train_from_the_bucket_upload_and_serve_from_it", "seaweedfs")}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and (item.originalname, callspec.params.get("store")
                                     ) in QUALITY_ONLY:
            item.add_marker(pytest.mark.quality)


@pytest.fixture(scope="module", params=["seaweedfs", "azurite"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Store]:
    folder = tmp_path_factory.mktemp(request.param)
    running = start_seaweed(folder) if request.param == "seaweedfs" else start_azurite(folder)
    yield running
    running.stop()
