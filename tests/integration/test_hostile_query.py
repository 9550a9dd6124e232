"""The query surface (``channel-health query``), hostile side: the result-size limit (issue #30 item 6)
and a standing battery of generated SQL texts (issue #30 item 7), on a real chDB.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Iterator
from unittest import mock

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.config import QueryLimits
from pipeline.storage import query as query_module
from pipeline.storage.query import QueryError, QueryLimitExceeded, run_readonly_query

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


# --- The standing battery (issue #30 item 7) -------------------------------------------------------------------
#
# The known escapes of issue #16 are replayed one by one in tests/integration/test_query_escapes.py (with and
# without the lexical gate); here they are fragments, and hypothesis composes new texts from them: heredoc
# strings, nested comments, several statements, table functions that reach files, network or processes, writes
# to tables and to system.*, SET and SETTINGS, INTO OUTFILE. Every text must end as a read-only result or a
# clear refusal, with the tables, the folder, the canary file and the listening socket untouched.

CANARY_TEXT = "CANARY-5b1e0c-never-readable"
HEADS = [
    "SELECT", "select", "WITH 1 AS x SELECT", "WITH $$'$$ AS q SELECT", "(SELECT", "SHOW", "SHOW TABLES", "DESCRIBE",
    "DESCRIBE TABLE", "EXPLAIN", "EXPLAIN AST", "EXPLAIN SYNTAX",
    "INSERT INTO channel_health.channel_verdicts (channel)", "INSERT INTO FUNCTION file('{cwd}/x.sh', 'RawBLOB')",
    "WITH 1 AS x INSERT INTO channel_health.quality_labels (label_id)",
    "ALTER TABLE channel_health.channel_verdicts DELETE WHERE 1",
    "ALTER TABLE channel_health.channel_verdicts UPDATE state = 'x' WHERE 1",
    "DROP TABLE channel_health.channel_verdicts", "TRUNCATE TABLE channel_health.request_events",
    "CREATE TABLE channel_health.t (x UInt8) ENGINE = Memory", "CREATE TABLE channel_health.t ENGINE = Log AS",
    "OPTIMIZE TABLE channel_health.channel_verdicts FINAL",
    "RENAME TABLE channel_health.channel_verdicts TO channel_health.v2",
    "DETACH TABLE channel_health.channel_verdicts", "SET readonly = 0", "SET max_result_rows = 0",
    "SYSTEM FLUSH LOGS", "SYSTEM DROP DNS CACHE", "KILL QUERY WHERE 1", "GRANT ALL ON *.* TO default",
    "INSERT INTO system.query_log SELECT * FROM system.query_log",
    "DELETE FROM channel_health.channel_verdicts WHERE 1",
    "BACKUP TABLE channel_health.channel_verdicts TO File('{cwd}/b')", "USE system",
    "EXCHANGE TABLES channel_health.channel_verdicts AND channel_health.quality_labels",
]
EXPRS = [
    "1", "*", "count()", "$$'$$", "$t$;DROP TABLE t$t$", "'a''b'", "'--'", "x", "q", "channel", "now()",
    "file('{canary}')", "file('/proc/self/environ')", "arrayMap(x -> FILE(x), ['{canary}'])",
    "1 IN url('http://127.0.0.1:{port}/x', 'CSV', 'x UInt8')", "getSetting('readonly')", "getServerSetting('tcp_port')",
    "currentUser()", "version()", "(SELECT 1)", "(SELECT count() FROM file('{canary}', 'LineAsString'))",
    "dictGet('d', 'x', 1)", "catboostEvaluate('{canary}', 1)", "throwIf(1)", "sleep(0.1)",
    "repeat('x', 100000)", "toString(number) AS number", "{p:String}",
]
SOURCES = [
    "", "FROM numbers(3)", "FROM system.one", "FROM system.tables", "FROM channel_health.channel_verdicts",
    "FROM channel_health.channel_verdicts FINAL", "FROM file('{canary}', 'LineAsString')",
    "FROM file('{canary}', 'RawBLOB')", "FROM fileCluster('default', '{canary}', 'LineAsString')",
    "FROM url('http://127.0.0.1:{port}/x', 'CSV', 'x String')", "FROM s3('http://127.0.0.1:{port}/b/k.csv', 'CSV', "
    "'x String')", "FROM remote('127.0.0.1:{port}', system.one)", "FROM remoteSecure('127.0.0.1:{port}', system.one)",
    "FROM cluster('default', system.one)", "FROM executable('cat {canary}', 'TSV', 'x String')",
    "FROM mysql('127.0.0.1:{port}', 'db', 't', 'u', 'p')", "FROM postgresql('127.0.0.1:{port}', 'db', 't', 'u', 'p')",
    "FROM hdfs('hdfs://127.0.0.1:{port}/x', 'CSV', 'x String')", "FROM input('x String')",
    "FROM view(SELECT * FROM file('{canary}', 'LineAsString'))", "FROM merge('channel_health', '.*')",
    "FROM values('x UInt8', 1, 2)", "FROM generateRandom('x UInt8', 1) LIMIT 2", "FROM numbers(3) AS n JOIN "
    "url('http://127.0.0.1:{port}/x', 'CSV', 'number UInt64') AS u USING number", "FROM azureBlobStorage('http://"
    "127.0.0.1:{port}', 'c', 'b')", "FROM icebergS3('http://127.0.0.1:{port}/t')", "FROM sqlite('{canary}', 't')",
    "FROM odbc('DSN=x', 't')", "FROM jdbc('jdbc:x', 't')", "FROM dictionary('d')", "FROM format(CSV, 'a\\n1')",
    "FROM system.numbers LIMIT 3", "FROM zeros(3)",
]
TAILS = [
    "", ";", ";;", "; DROP TABLE channel_health.channel_verdicts", "; SELECT 2", "-- '\n; DROP TABLE t",
    "/* /* */ */", "/* a /* b */ ; */ DROP TABLE t", "/* unterminated", "'", "$$", "$$'$$", "LIMIT 2",
    "INTO OUTFILE '{cwd}/out.sh'", "INTO OUTFILE $$out2.sh$$ TRUNCATE", "SETTINGS readonly = 0",
    "SETTINGS max_result_bytes = 0, max_execution_time = 0", "FORMAT TSV", "FORMAT Native", "WHERE 1 = 1",
    "UNION ALL SELECT * FROM file('{canary}', 'LineAsString')", ") UNION ALL (SELECT 2)", "VALUES ('z')",
    "SELECT 'z'", "; INSERT INTO FUNCTION file($$x.sh$$, $$RawBLOB$$) SELECT 'echo pwned'", "GROUP BY 1 ORDER BY 1",
]
QUIET_TAILS = ["", ";", "/* /* */ */", "LIMIT 2", "WHERE 1 = 1", "GROUP BY 1 ORDER BY 1", "-- '\n"]
SEPARATORS = [" ", "\n", "\t", "/**/", " /* /* nested */ */ ", " -- c\n", "\u00a0", " $$ $$ "]


def _texts():
    fragment = st.sampled_from(HEADS + EXPRS + SOURCES + TAILS)
    structured = st.tuples(st.sampled_from(HEADS), st.sampled_from(EXPRS), st.sampled_from(SOURCES),
                           st.sampled_from(TAILS), st.sampled_from(SEPARATORS)).map(
        lambda t: t[4].join(part for part in t[:4] if part))
    free = st.tuples(st.lists(fragment, min_size=1, max_size=6), st.sampled_from(SEPARATORS)).map(
        lambda t: t[1].join(t[0]))
    selects = st.tuples(st.sampled_from(["SELECT", "WITH 1 AS x SELECT", "WITH $$'$$ AS q SELECT"]),
                        st.sampled_from(EXPRS), st.sampled_from(SOURCES), st.sampled_from(QUIET_TAILS),
                        st.sampled_from(SEPARATORS)).map(lambda t: t[4].join(part for part in t[:4] if part))
    return st.one_of(selects, structured, free)


def _state(client: object) -> tuple:
    tables = client.query("SELECT database, name FROM system.tables WHERE database NOT IN ('system', "
                          "'INFORMATION_SCHEMA', 'information_schema') ORDER BY database, name").result_rows
    counts = tuple(client.query(f"SELECT count() FROM channel_health.{t}").result_rows[0][0]
                   for t in ("channel_verdicts", "request_events", "quality_labels"))
    settings = client.query("SELECT getSetting('readonly'), getSetting('max_result_rows')").result_rows
    return tables, counts, settings


@pytest.fixture
def arena(data, tmp_path: Path) -> Iterator[dict]:
    """Two verdict rows, a canary file beside the data, and a listening socket the network escapes aim at."""
    data.command(
        "INSERT INTO channel_health.channel_verdicts (channel, route, state, weight, reasons, metrics, ts, seq,"
        " schema_version, ingested_at) VALUES"
        " ('a', 'r', 'open', 0, ['error_rate'], '{}', fromUnixTimestamp64Milli(1767225600000), 1, 1, now64(3)),"
        " ('b', 'r', 'healthy', 1, [], '{}', fromUnixTimestamp64Milli(1767225630000), 1, 1, now64(3))")
    canary = tmp_path / "canary.txt"
    canary.write_text(CANARY_TEXT + "\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listener.setblocking(False)
        yield {"client": data, "canary": canary, "cwd": tmp_path / "cwd", "listener": listener, "tmp": tmp_path,
               "before": _state(data), "outcomes": {}}


def _no_gate(sql: str) -> str:
    """Stand-in for the lexical gate: lets everything through (ClickHouse's own enforcement alone)."""
    return sql.strip().rstrip(";")


def _run_one(arena: dict, sql: str, gate: bool) -> str:
    """Run ``sql``; the outcome's kind. Anything but a result or a clear refusal fails the test."""
    limits = QueryLimits(max_execution_time_s=2.0, max_memory_bytes=256 * 2**20, max_result_rows=1000,
                         max_result_bytes=2**20)
    params = {"p": "v"} if "{p:String}" in sql else None
    patch = contextlib.nullcontext() if gate else mock.patch.object(query_module, "check_readonly_sql", _no_gate)
    try:
        with patch:
            cols, rows = run_readonly_query(arena["client"], sql, params, limits)
    except (QueryError, QueryLimitExceeded) as exc:  # QueryRefused, QueryParameterError: ours, a reason given
        assert str(exc), repr(exc)
        assert CANARY_TEXT not in str(exc)
        return type(exc).__name__
    except DatabaseError as exc:  # ClickHouse refused or stopped it: its code and error name say why
        text = str(exc)
        assert "DB::Exception" in text and "Code: " in text, f"unclear error for {sql!r}: {exc!r}"
        assert CANARY_TEXT not in text
        return text.rsplit("(", 1)[-1].rstrip(") \n")[:40]
    if gate:  # the gate let it through: one statement with an allowed first keyword
        query_module.check_readonly_sql(sql)
    assert len(rows) <= 1000 and CANARY_TEXT not in repr(rows), sql
    assert all(len(r) == len(cols) for r in rows)
    return "result"


def _assert_untouched(arena: dict, sql: str) -> None:
    assert _state(arena["client"]) == arena["before"], sql
    assert sorted(p.name for p in arena["tmp"].iterdir()) == ["canary.txt", "chdb", "cwd"], sql
    assert [p.name for p in arena["cwd"].iterdir() if p.name != ".hypothesis"] == [], sql  # hypothesis' own folder
    assert arena["canary"].read_text() == CANARY_TEXT + "\n"
    with pytest.raises(BlockingIOError):  # nothing connected to the listener
        arena["listener"].accept()


def test_fuzzed_sql_is_a_read_only_result_or_a_clear_refusal_and_touches_nothing(arena) -> None:
    port = arena["listener"].getsockname()[1]

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(_texts())
    def check(template: str) -> None:
        sql = template.replace("{canary}", str(arena["canary"])).replace("{port}", str(port)).replace(
            "{cwd}", str(arena["cwd"]))
        for gate in (True, False):
            kind = _run_one(arena, sql, gate)
            arena["outcomes"][kind] = arena["outcomes"].get(kind, 0) + 1
            _assert_untouched(arena, sql)

    check()
    outcomes = arena["outcomes"]
    assert outcomes.get("result", 0) >= 1 and outcomes.get("QueryRefused", 0) >= 1, outcomes


@pytest.mark.parametrize("sql", [
    "SELECT * FROM file('{canary}', 'LineAsString')",
    "SELECT file('{canary}')",
    "SELECT * FROM view(SELECT * FROM file('{canary}', 'LineAsString'))",
    "SELECT * FROM executable('cat {canary}', 'TSV', 'x String')",
    "SELECT 1 UNION ALL SELECT * FROM file('{canary}', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:{port}/x', 'CSV', 'x String')",
    "SELECT * FROM remote('127.0.0.1:{port}', system.one)",
    "SELECT 1 /* /* */ */ ; DROP TABLE channel_health.channel_verdicts",
    "SELECT $$'$$; INSERT INTO FUNCTION file('{cwd}/x.sh', 'RawBLOB') SELECT 'echo pwned' -- '",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT 'echo pwned' INTO OUTFILE '{cwd}/out.sh'",
    "SET readonly = 0",
    "SYSTEM FLUSH LOGS",
    "ALTER TABLE channel_health.channel_verdicts DELETE WHERE 1",
])
def test_known_shapes_with_a_canary_are_refused_and_touch_nothing(arena, sql: str) -> None:
    """The fuzzer's fragments, fixed: the canary file is not read, the socket not reached, nothing written."""
    sql = sql.replace("{canary}", str(arena["canary"])).replace(
        "{port}", str(arena["listener"].getsockname()[1])).replace("{cwd}", str(arena["cwd"]))
    for gate in (True, False):
        assert _run_one(arena, sql, gate) != "result", sql
        _assert_untouched(arena, sql)
