"""``channel-health query`` opens existing data only, and says where it looked (issue #17)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.storage.client import close_clients

pytestmark = pytest.mark.integration

HINT = "set CHANNEL_HEALTH_CLICKHOUSE_URL to the data: chdb:///absolute/path/to/data/chdb"


def test_query_from_another_directory_creates_nothing_and_says_where_it_looked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    close_clients()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CHANNEL_HEALTH_CLICKHOUSE_URL", raising=False)
    result = CliRunner().invoke(app, ["query", "SELECT count() FROM channel_health.channel_verdicts"])
    assert result.exit_code == 1, result.output
    assert f"no chDB data directory at {tmp_path / 'data' / 'chdb'}; {HINT}" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []  # no ./data/chdb created


def test_query_on_a_folder_without_the_database_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    close_clients()
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", f"chdb://{tmp_path / 'empty'}")
    try:
        result = CliRunner().invoke(app, ["query", "SELECT 1"])
    finally:
        close_clients()
    assert result.exit_code == 1, result.output
    assert (f"database 'channel_health' does not exist in chDB directory {tmp_path / 'empty'}"
            in " ".join(result.output.split()))


def test_unknown_table_names_the_clickhouse_it_queried(ch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"chdb://{tmp_path / 'chdb'}"
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", url)
    result = CliRunner().invoke(app, ["query", "SELECT count() FROM channel_health.no_such_table"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "UNKNOWN_TABLE" in text and f"(queried ClickHouse at {url}; {HINT}" in text
    ok = CliRunner().invoke(app, ["query", "SELECT count() AS n FROM channel_health.channel_verdicts", "--json"])
    assert ok.exit_code == 0 and ok.output.strip() == '{"n": 0}', ok.output
