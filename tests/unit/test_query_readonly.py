"""The read-only query gate, server-side parameter binding and table output."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

from pipeline.config import Settings
from pipeline.storage.query import (
    QueryParameterError,
    QueryRefused,
    check_readonly_sql,
    format_table,
    placeholders,
    run_readonly_query,
)


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("INSERT INTO channel_health.request_events VALUES ('x')", "got INSERT"),
        ("DROP TABLE channel_health.request_events", "got DROP"),
        ("ALTER TABLE channel_health.request_events DELETE WHERE 1", "got ALTER"),
        ("TRUNCATE TABLE channel_health.request_events", "got TRUNCATE"),
        ("OPTIMIZE TABLE channel_health.request_events FINAL", "got OPTIMIZE"),
        ("SET readonly = 0", "got SET"),
        ("SELECT 1; DROP TABLE channel_health.request_events", "exactly one statement, got 2"),
        ("SELECT 1;;SELECT 2", "exactly one statement, got 2"),
        ("/* SELECT */ DROP TABLE t", "got DROP"),
        ("-- SELECT\nDELETE FROM t WHERE 1", "got DELETE"),
        ("SELECT * FROM system.tables INTO OUTFILE '/tmp/x.csv'", "INTO OUTFILE"),
        ("", "exactly one statement, got 0"),
        ("  ;  -- nothing\n", "exactly one statement, got 0"),
        ("SELECT 'unterminated", "unterminated ' quote"),
        # Issue #16: heredoc strings and nested comments hid a second statement from the old lexer.
        ("SELECT $$'$$; DROP TABLE channel_health.channel_verdicts -- '", "exactly one statement, got 2"),
        ("WITH $$'$$ AS q INSERT INTO channel_health.request_events SELECT * FROM t -- '", "INSERT writes"),
        ("SELECT $t$'$t$; INSERT INTO FUNCTION file($$x.sh$$,$$RawBLOB$$) SELECT 1 -- '", "got 2"),
        ("SELECT 1 /* a /* b */ ; */ INTO OUTFILE 'x'", "INTO OUTFILE"),
        ("SELECT 1 /* a /* b */ */; DROP TABLE t", "exactly one statement, got 2"),
        ("SELECT $$never closed", r"unterminated \$\$ string"),
        ("SELECT 1 /* a /* b */", "unterminated /\\* comment"),
    ],
)
def test_write_and_multi_statements_are_refused(sql: str, reason: str) -> None:
    with pytest.raises(QueryRefused, match=reason):
        check_readonly_sql(sql)


@pytest.mark.parametrize(
    ("sql", "statement"),
    [
        ("select 1;", "select 1"),
        ("SELECT ';DROP TABLE t' AS s", "SELECT ';DROP TABLE t' AS s"),
        ("WITH 2 AS x SELECT x", "WITH 2 AS x SELECT x"),
        ("(SELECT 1) UNION ALL (SELECT 2)", "(SELECT 1) UNION ALL (SELECT 2)"),
        ("SHOW TABLES FROM channel_health", "SHOW TABLES FROM channel_health"),
        ("DESCRIBE TABLE channel_health.request_events", "DESCRIBE TABLE channel_health.request_events"),
        ("desc channel_health.request_events", "desc channel_health.request_events"),
        ("EXPLAIN SELECT 1", "EXPLAIN SELECT 1"),
        ("SELECT $$;INSERT$$, $a$$$;$a$ /* /* ; */ ; */", "SELECT $$;INSERT$$, $a$$$;$a$ /* /* ; */ ; */"),
        ("-- why\nSELECT `into outfile` FROM t -- ;", "-- why\nSELECT `into outfile` FROM t -- ;"),
    ],
)
def test_read_statements_pass(sql: str, statement: str) -> None:
    assert check_readonly_sql(sql) == statement


def test_placeholders_ignore_strings_and_comments() -> None:
    sql = "SELECT {a:String}, '{b:UInt8}' /* {c:UInt8} */ FROM t WHERE x IN {d: Array(UInt32)}"
    assert placeholders(sql) == {"a", "d"}


@pytest.fixture
def chdb_client(tmp_path: Path) -> Iterator[object]:
    pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl

    close_clients()
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{tmp_path / 'chdb'}"))
    apply_ddl(client)
    client.command(
        "INSERT INTO channel_health.channel_verdicts (channel, route, state, weight, reasons, metrics, ts, seq,"
        " schema_version, ingested_at) VALUES"
        " ('a', 'r', 'open', 0, ['error_rate'], '{}', fromUnixTimestamp64Milli(1767225600000), 1, 1, now64(3)),"
        " ('b', 'r', 'healthy', 1, [], '{}', fromUnixTimestamp64Milli(1767225630000), 1, 1, now64(3))"
    )
    yield client
    close_clients()


def test_select_with_bound_parameters_on_chdb(chdb_client) -> None:
    cols, rows = run_readonly_query(
        chdb_client,
        "SELECT channel, state, weight, ts FROM channel_health.channel_verdicts FINAL "
        "WHERE channel = {ch:String} AND seq >= {min_seq:UInt64}",
        {"ch": "a", "min_seq": 1},
    )
    assert cols == ["channel", "state", "weight", "ts"]
    assert rows == [("a", "open", 0.0, datetime(2026, 1, 1, tzinfo=timezone.utc))]


def test_bound_value_is_data_not_sql(chdb_client) -> None:
    cols, rows = run_readonly_query(
        chdb_client, "SELECT count() AS n FROM channel_health.channel_verdicts WHERE channel = {ch:String}",
        {"ch": "a' OR '1'='1"},
    )
    assert (cols, rows) == (["n"], [(0,)])


def test_parameters_must_match_placeholders(chdb_client) -> None:
    with pytest.raises(QueryParameterError, match=r"placeholders without a value: \['ch'\]"):
        run_readonly_query(chdb_client, "SELECT {ch:String}")
    with pytest.raises(QueryParameterError, match=r"values without a \{name:Type\} placeholder: \['x'\]"):
        run_readonly_query(chdb_client, "SELECT %(x)s", {"x": 1})


def test_refused_statement_never_reaches_the_database(chdb_client) -> None:
    with pytest.raises(QueryRefused):
        run_readonly_query(chdb_client, "SELECT 1; DROP TABLE channel_health.channel_verdicts")
    _, rows = run_readonly_query(chdb_client, "SELECT count() FROM channel_health.channel_verdicts")
    assert rows == [(2,)]


class _FakeResult:
    def __init__(self, column_names: list[str], rows: list[tuple]) -> None:
        self.column_names, self.result_rows = column_names, rows


def _fake_http_client(readonly: str) -> tuple[object, list[tuple[str, object, object]]]:
    """An HttpClient that answers formatQuery / EXPLAIN AST / the query and records the settings sent."""
    from clickhouse_connect.driver.httpclient import HttpClient
    from clickhouse_connect.driver.models import SettingDef

    calls: list[tuple[str, object, object]] = []
    http = object.__new__(HttpClient)  # no server needed
    http.server_settings = {"readonly": SettingDef(name="readonly", value=readonly, readonly=int(readonly))}

    def query(sql: str, parameters=None, settings=None):  # noqa: ANN001
        calls.append((sql, parameters, settings))
        if sql.startswith("SELECT formatQuery("):
            return _FakeResult(["q"], [("SELECT {ch:String} AS c",)])
        if sql.startswith("EXPLAIN AST "):
            return _FakeResult(["explain"], [("SelectWithUnionQuery (children 1)",), (" ExpressionList",)])
        return _FakeResult(["c"], [("a",)])

    class _Stream:  # what query_row_block_stream returns: a context over blocks, ``source.column_names``
        def __init__(self, result: _FakeResult) -> None:
            self.source, self._blocks = result, [result.result_rows]

        def __enter__(self) -> "_Stream":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def __iter__(self):
            return iter(self._blocks)

    http.query = query
    http.query_row_block_stream = lambda sql, parameters=None, settings=None: _Stream(query(sql, parameters, settings))
    return http, calls


def test_http_client_sends_readonly_and_limits_with_every_request() -> None:
    from pipeline.config import QueryLimits

    http, calls = _fake_http_client("0")
    limits = QueryLimits(max_execution_time_s=7.5, max_memory_bytes=2**28, max_result_rows=42)
    assert run_readonly_query(http, "select {ch:String} as c", {"ch": "a"}, limits) == (["c"], [("a",)])
    inspect = {"max_execution_time": 7.5, "max_memory_usage": 2**28, "allow_introspection_functions": 0,
               "allow_ddl": 0, "readonly": 1}
    run = {"max_execution_time": 7.5, "max_memory_usage": 2**28, "max_result_rows": 42,
           "max_result_bytes": 64 * 2**20, "result_overflow_mode": "throw", "allow_introspection_functions": 0,
           "allow_ddl": 0, "readonly": 1}
    assert calls == [
        ("SELECT formatQuery({q:String})", {"q": "select {ch:String} as c"}, inspect),  # the SQL is a bound value
        ("EXPLAIN AST SELECT {ch:String} AS c", {"ch": "a"}, inspect),
        ("SELECT {ch:String} AS c", {"ch": "a"}, run),  # ClickHouse's canonical text is what runs
    ]
    assert list(run)[-1] == "readonly"


def test_http_user_that_is_read_only_already_gets_no_settings_and_readonly_2_no_readonly() -> None:
    http, calls = _fake_http_client("1")  # ClickHouse refuses any setting change: the profile sets limits
    run_readonly_query(http, "SELECT {ch:String} AS c", {"ch": "a"})
    assert [settings for _, _, settings in calls] == [None, None, None]
    http, calls = _fake_http_client("2")  # may change settings except readonly
    run_readonly_query(http, "SELECT {ch:String} AS c", {"ch": "a"})
    assert [sorted(settings) for _, _, settings in calls][2] == [
        "allow_ddl", "allow_introspection_functions", "max_execution_time", "max_memory_usage", "max_result_bytes",
        "max_result_rows", "result_overflow_mode"]


def test_format_table() -> None:
    text = format_table(
        ["channel", "weight", "reasons", "ts", "note"],
        [("a", 0.123456789, ["[bold]error_rate"], datetime(2026, 1, 1, tzinfo=timezone.utc), None)],
    )
    lines = text.splitlines()
    assert "channel" in lines[1] and "reasons" in lines[1]
    assert "│ a       │ 0.123457 │ ['[bold]error_rate'] │ 2026-01-01T00:00:00+00:00 │ NULL │" in lines
    assert lines[-1] == "(1 row)"
    assert format_table(["x"], []).splitlines()[-1] == "(0 rows)"


def test_query_limits_are_read_from_the_environment() -> None:
    from pipeline.config import ConfigError, QueryLimits, load_settings

    assert load_settings({}).query_limits == QueryLimits(30.0, 2 * 1024**3, 100_000, 64 * 1024**2)
    env = {"CHANNEL_HEALTH_QUERY_MAX_EXECUTION_TIME_S": "1.5", "CHANNEL_HEALTH_QUERY_MAX_MEMORY_BYTES": "1048576",
           "CHANNEL_HEALTH_QUERY_MAX_RESULT_ROWS": "7", "CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES": "4096"}
    assert load_settings(env).query_limits == QueryLimits(1.5, 1048576, 7, 4096)
    for name, raw in (("EXECUTION_TIME_S", "0"), ("EXECUTION_TIME_S", "inf"), ("MEMORY_BYTES", "2G"),
                      ("MEMORY_BYTES", "1000"), ("RESULT_ROWS", "0"), ("RESULT_BYTES", "0"),
                      ("RESULT_BYTES", "64MiB")):
        with pytest.raises(ConfigError, match=f"CHANNEL_HEALTH_QUERY_MAX_{name} must be .*, got '{raw}'"):
            load_settings({f"CHANNEL_HEALTH_QUERY_MAX_{name}": raw})


def test_limit_errors_name_the_setting_to_raise() -> None:
    from pipeline.storage.result_limit import QueryLimitExceeded, limit_error, take_rows

    cases = {
        "Code: 396. DB::Exception: Limit for result exceeded, max bytes: 1.00 MiB, current bytes: 1.2 MiB. "
        "(TOO_MANY_ROWS_OR_BYTES)": "CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES",
        "Code: 396. DB::Exception: Limit for result exceeded, max rows: 10.00, current rows: 11.00. "
        "(TOO_MANY_ROWS_OR_BYTES)": "CHANNEL_HEALTH_QUERY_MAX_RESULT_ROWS",
        "Code: 159. DB::Exception: Timeout exceeded: elapsed 1.0 seconds, maximum: 1. (TIMEOUT_EXCEEDED)":
            "CHANNEL_HEALTH_QUERY_MAX_EXECUTION_TIME_S",
        "Code: 241. DB::Exception: Query memory limit exceeded: would use 1.86 GiB. (MEMORY_LIMIT_EXCEEDED)\nstack":
            "CHANNEL_HEALTH_QUERY_MAX_MEMORY_BYTES",
    }
    for message, setting in cases.items():
        err = limit_error(RuntimeError(message))
        assert isinstance(err, QueryLimitExceeded) and err.setting == setting
        assert str(err).endswith(f"or raise {setting}") and message.splitlines()[0] in str(err)
    assert limit_error(RuntimeError("Code: 164. DB::Exception: Cannot execute query in readonly mode. (READONLY)")) \
        is None
    assert take_rows([[("ab", 1)], [("c", None)]], 12) == [("ab", 1), ("c", None)]  # 2 + 8 + 1 + 1 = 12 bytes
    with pytest.raises(QueryLimitExceeded, match="more than 11 bytes after 2 rows"):
        take_rows(iter([[("ab", 1)], [("c", None)], [("never read", 0)]]), 11)
