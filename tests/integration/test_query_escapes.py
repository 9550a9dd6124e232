"""Issue #16's escapes from ``channel-health query``, replayed on a real chDB: every one is refused.

Each escape is tried twice: through :func:`run_readonly_query` as shipped, and
with the lexical gate (Python's text check) switched off, so that ClickHouse's
own enforcement (its parser, the AST check, ``readonly=1``, the limits) is
shown to refuse it alone. After each: the tables and their rows are intact,
no file was written, and nothing connected to the listening socket that the
network escapes aim at.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterator

import pytest

from pipeline.config import QueryLimits
from pipeline.storage import query as query_module
from pipeline.storage.query import QueryRefused, run_readonly_query
from pipeline.storage.readonly import ReadOnlySession

pytestmark = pytest.mark.integration

LIMITS = QueryLimits(max_execution_time_s=1.0, max_memory_bytes=100 * 2**20, max_result_rows=1000)


@pytest.fixture
def data(ch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The ``ch`` chDB client with two verdict rows; cwd is an empty folder, so relative files land there."""
    ch.command(
        "INSERT INTO channel_health.channel_verdicts (channel, route, state, weight, reasons, metrics, ts, seq,"
        " schema_version, ingested_at) VALUES"
        " ('a', 'r', 'open', 0, ['error_rate'], '{}', fromUnixTimestamp64Milli(1767225600000), 1, 1, now64(3)),"
        " ('b', 'r', 'healthy', 1, [], '{}', fromUnixTimestamp64Milli(1767225630000), 1, 1, now64(3))"
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield ch


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket on 127.0.0.1 that the network escapes aim at; a connection would queue on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def _state(client: object) -> tuple[list[tuple], int, int]:
    tables = client.query("SELECT name FROM system.tables WHERE database = 'channel_health' ORDER BY name").result_rows
    verdicts = client.query("SELECT count() FROM channel_health.channel_verdicts").result_rows[0][0]
    events = client.query("SELECT count() FROM channel_health.request_events").result_rows[0][0]
    return tables, verdicts, events


def _no_gate(sql: str) -> str:
    """Stand-in for the lexical gate: lets everything through (to test ClickHouse's own enforcement)."""
    return sql.strip().rstrip(";")


PAYLOAD = "echo pwned"
ESCAPES = {
    "drop after $$": "SELECT $$'$$; DROP TABLE channel_health.channel_verdicts -- '",
    "insert after WITH $$": "WITH $$'$$ AS q INSERT INTO channel_health.channel_verdicts (channel, route, state, "
                            "weight, reasons, metrics, ts, seq, schema_version, ingested_at) SELECT 'x', 'r', "
                            "'open', 0, [], '{}', now64(3), 9, 1, now64(3) -- '",
    "insert into function file": f"SELECT $$'$$; INSERT INTO FUNCTION file($$x.sh$$,$$RawBLOB$$) "
                                 f"SELECT '{PAYLOAD}' -- '",
    "into outfile": "SELECT 'echo pwned' INTO OUTFILE 'out.sh'",
    "into outfile in $$": "SELECT $$echo pwned$$ INTO OUTFILE $$out2.sh$$ TRUNCATE",
    "into outfile nested comment": "SELECT 1 /* a /* b */ c */ INTO OUTFILE 'out3.sh'",
    "explain into outfile": "EXPLAIN SELECT 1 INTO OUTFILE 'out4.sh'",
    "file /etc/passwd": "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "file environ": "SELECT * FROM file('/proc/self/environ', 'RawBLOB')",
    "scalar file environ": "SELECT file('/proc/self/environ')",
    "scalar FILE in lambda": "SELECT arrayMap(x -> FILE(x), ['/etc/passwd'])",
    "describe file": "DESCRIBE TABLE file('/etc/passwd', 'LineAsString')",
    "executable": "SELECT * FROM executable('sh -c id', 'TSV', 'x String')",
    "input": "SELECT * FROM input('x String')",
    "settings readonly=0": "SELECT 1 SETTINGS readonly = 0",
    "settings lift limit": "SELECT count() FROM numbers(1e12) SETTINGS max_execution_time = 0",
}
NETWORK = {
    "url": "SELECT * FROM url('http://127.0.0.1:{port}/x', 'CSV', 'x String')",
    "url after IN": "SELECT 1 IN url('http://127.0.0.1:{port}/x', 'CSV', 'x UInt8')",
    "s3": "SELECT * FROM s3('http://127.0.0.1:{port}/bucket/key.csv', 'CSV', 'x String')",
    "remote": "SELECT * FROM remote('127.0.0.1:{port}', system.one)",
    "remoteSecure": "SELECT * FROM remoteSecure('127.0.0.1:{port}', system.one)",
    "mysql": "SELECT * FROM mysql('127.0.0.1:{port}', 'db', 't', 'u', 'p')",
    "postgresql": "SELECT * FROM postgresql('127.0.0.1:{port}', 'db', 't', 'u', 'p')",
    "hdfs": "SELECT * FROM hdfs('hdfs://127.0.0.1:{port}/x', 'CSV', 'x String')",
    "view over url": "SELECT * FROM view(SELECT * FROM url('http://127.0.0.1:{port}/x', 'CSV', 'x String'))",
    "join url": "SELECT * FROM numbers(1) AS n JOIN url('http://127.0.0.1:{port}/x', 'CSV', 'number UInt64') "
                "AS u USING number",
}


def _assert_refused(client: object, sql: str) -> None:
    with pytest.raises(Exception) as err:  # QueryRefused, or ClickHouse's own refusal
        run_readonly_query(client, sql, limits=LIMITS)
    assert isinstance(err.value, QueryRefused) or "READONLY" in str(err.value), repr(err.value)


@pytest.mark.parametrize("gate", ["gate", "no-gate"])
def test_escapes_are_refused_and_change_nothing(data, gate: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if gate == "no-gate":
        monkeypatch.setattr(query_module, "check_readonly_sql", _no_gate)
    before = _state(data)
    assert before[1:] == (2, 0) and len(before[0]) >= 5
    for name, sql in ESCAPES.items():
        _assert_refused(data, sql)
        assert _state(data) == before, name
    assert os.listdir(tmp_path / "cwd") == []  # no x.sh, out*.sh
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chdb", "cwd"]


@pytest.mark.parametrize("gate", ["gate", "no-gate"])
def test_network_table_functions_are_refused_before_connecting(data, listener: socket.socket, gate: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if gate == "no-gate":
        monkeypatch.setattr(query_module, "check_readonly_sql", _no_gate)
    port = listener.getsockname()[1]
    for sql in NETWORK.values():
        with pytest.raises(QueryRefused, match=r"reaches files, network|is not allowed"):
            run_readonly_query(data, sql.format(port=port), limits=LIMITS)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected


def test_clickhouse_readonly_session_refuses_writes_on_its_own(data) -> None:
    """No Python check at all: statements straight into the limited session are refused by ClickHouse."""
    with ReadOnlySession(data, LIMITS) as session:
        for sql in ("DROP TABLE channel_health.channel_verdicts",
                    "INSERT INTO channel_health.request_events (event_id) VALUES ('x')",
                    "INSERT INTO FUNCTION file('x.sh', 'RawBLOB') SELECT 'echo pwned'",
                    "CREATE TABLE channel_health.t (x UInt8) ENGINE = Memory",
                    "TRUNCATE TABLE channel_health.channel_verdicts",
                    "SET readonly = 0",
                    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
                    "SELECT * FROM remote('127.0.0.1:1', system.one)"):
            with pytest.raises(Exception, match="READONLY"):
                session.query(sql, None)
        with pytest.raises(Exception, match="Multi-statements are not allowed"):
            session.canonical("SELECT $$'$$; DROP TABLE channel_health.channel_verdicts -- '")
    assert _state(data)[1:] == (2, 0)
    assert os.listdir(".") == []
    data.command("INSERT INTO channel_health.quality_labels (label_id) VALUES ('writer')")  # the writer still writes
    assert data.query("SELECT label_id FROM channel_health.quality_labels").result_rows == [("writer",)]


def test_limits_stop_long_large_and_wide_queries(data) -> None:
    with pytest.raises(Exception, match="TIMEOUT_EXCEEDED"):
        run_readonly_query(data, "SELECT count() FROM numbers(1e12)", limits=LIMITS)
    with pytest.raises(Exception, match="MEMORY_LIMIT_EXCEEDED"):
        run_readonly_query(data, "SELECT length(groupArray(number)) FROM numbers(1e10)", limits=LIMITS)
    with pytest.raises(Exception, match="TOO_MANY_ROWS_OR_BYTES"):
        run_readonly_query(data, "SELECT number FROM numbers(1001)", limits=LIMITS)
    cols, rows = run_readonly_query(data, "SELECT number FROM numbers(1000)", limits=LIMITS)
    assert cols == ["number"] and rows[-1] == (999,) and len(rows) == 1000


def test_allowed_reads_still_work(data) -> None:
    for sql, expected in [
        ("SELECT $$'$$ AS q", [("'",)]),
        ("SELECT count() FROM channel_health.channel_verdicts /* a /* nested */ comment */", [(2,)]),
        ("SELECT sum(generate_series) FROM generateSeries(1, 4)", [(10,)]),
        ("SELECT count() FROM merge('channel_health', '^channel_verdicts$')", [(2,)]),
        ("SELECT x FROM values('x UInt8', 5)", [(5,)]),
        ("SELECT format('{}-{}', 'a', 'b')", [("a-b",)]),
    ]:
        assert run_readonly_query(data, sql, limits=LIMITS)[1] == expected, sql
