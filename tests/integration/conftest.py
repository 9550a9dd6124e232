"""Fixtures shared by the integration tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from pipeline.config import Settings
from pipeline.storage.client import close_clients, open_client
from pipeline.storage.schema import apply_ddl


@pytest.fixture
def ch(tmp_path: Path) -> Iterator[object]:
    """A clickhouse-connect client on a fresh chDB directory (``tmp_path / "chdb"``) with the schema
    applied (:func:`~pipeline.storage.schema.apply_ddl`); every cached client is closed before and after."""
    close_clients()
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{tmp_path / 'chdb'}"))
    apply_ddl(client)
    yield client
    close_clients()
