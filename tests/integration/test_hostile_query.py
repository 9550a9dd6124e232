"""The query surface (``channel-health query``), hostile side: the result-size limit (issue #30 item 6)
and a standing battery of generated SQL texts (issue #30 item 7), on a real chDB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import QueryLimits
from pipeline.storage.query import QueryLimitExceeded, run_readonly_query

pytestmark = pytest.mark.integration

SMALL = QueryLimits(max_execution_time_s=5.0, max_memory_bytes=512 * 2**20, max_result_rows=1_000_000,
                    max_result_bytes=2**20)


@pytest.fixture
def data(ch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The ``ch`` chDB client; cwd is an empty folder (relative files would land there)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield ch


def test_clickhouse_refuses_a_result_larger_than_max_result_bytes(data) -> None:
    """8 MB of UInt64 against a 1 MiB limit: ClickHouse's max_result_bytes stops it (its error name shows)."""
    with pytest.raises(QueryLimitExceeded) as err:
        run_readonly_query(data, "SELECT number FROM numbers(1000000)", limits=SMALL)
    assert err.value.limit == "bytes" and err.value.setting == "CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES"
    text = str(err.value)
    assert text.startswith("query stopped by its result size limit (ClickHouse TOO_MANY_ROWS_OR_BYTES: ")
    assert "max bytes: 1.00 MiB" in text and text.endswith("or raise CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES")
    cols, rows = run_readonly_query(data, "SELECT number FROM numbers(100000)", limits=SMALL)  # 800 KB: fits
    assert cols == ["number"] and len(rows) == 100_000 and rows[-1] == (99_999,)


def test_a_constant_column_counts_once_per_row_not_once_per_block(data) -> None:
    """ClickHouse counts ``repeat('x', 100000)`` once per block (95 MiB pass its 1 MiB limit); the client
    counts the rows it reads and stops after about the limit."""
    with pytest.raises(QueryLimitExceeded, match=r"result size limit \(more than 1,048,576 bytes after 1,000 rows"):
        run_readonly_query(data, "SELECT repeat('x', 100000) AS s FROM numbers(1000)", limits=SMALL)
    cols, rows = run_readonly_query(data, "SELECT repeat('x', 1000) AS s FROM numbers(1000)", limits=SMALL)
    assert cols == ["s"] and len(rows) == 1000 and rows[0] == ("x" * 1000,)


def test_the_cli_says_which_limit_stopped_a_query_and_how_to_raise_it(ch, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", f"chdb://{tmp_path / 'chdb'}")
    monkeypatch.setenv("CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES", "65536")
    result = CliRunner().invoke(app, ["query", "SELECT toString(number) AS s FROM numbers(100000)"])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "query stopped by its result size limit" in text and "raise CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES" in text
    assert "Traceback" not in result.output and "(100000 rows)" not in text
    monkeypatch.setenv("CHANNEL_HEALTH_QUERY_MAX_RESULT_ROWS", "10")
    result = CliRunner().invoke(app, ["query", "SELECT number FROM numbers(11)"])
    assert result.exit_code == 1 and "raise CHANNEL_HEALTH_QUERY_MAX_RESULT_ROWS" in " ".join(result.output.split())
    ok = CliRunner().invoke(app, ["query", "SELECT number AS n FROM numbers(10)", "--json"])
    assert ok.exit_code == 0 and ok.output.splitlines()[-1] == '{"n": 9}', ok.output
