"""Suite-wide fixtures.

chDB allows one data directory per process, and ``pytest -n 2 --dist loadfile``
runs many test modules one after another in the same worker process. A module
that leaves its chDB client cached would make the next module's ``open_client``
on another directory fail with ``StorageConnectError`` — an error that depends
only on which modules xdist happened to give the same worker.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="module")
def _close_chdb_between_modules() -> Iterator[None]:
    """Close every cached chDB client before and after each test module."""
    from pipeline.storage.client import close_clients

    close_clients()
    yield
    close_clients()
