"""``request_events`` through JSON payloads (:mod:`pipeline.sinks.json_table`) against chDB.

Covers the parts the ClickHouse-sink tests do not: the bounds, a payload
ClickHouse cannot read (dropped, reported, the others written), an outage in
the middle of writing payloads one by one, and the same in the sink process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.contracts import ExpectedCall, RequestEvent
from pipeline.sinks.errors import SinkBackpressure, SinkWriteError
from pipeline.sinks.json_table import JsonTableSink, is_data_error
from pipeline.sinks.process import ProcessSink
from pipeline.sinks.clickhouse import ClickHouseSink
from pipeline.sinks.rows import EVENT_COLUMNS, EVENTS_INPUT_TABLE, EVENTS_TABLE, event_payload, event_row, now_ms
from pipeline.sinks.table import TableSink
from pipeline.storage.client import close_clients, open_client

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
#: A row whose ts_ms is not a number: ClickHouse refuses the insert (Code: 27).
UNREADABLE = b'[[{"event_id":"bad","ts_ms":"yesterday","channel":"c","route":"r","status":"ok","latency_ms":1},' \
             b'null,null]]'


def _settings(path: Path) -> Settings:
    return Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{path}")


def _payload(first: int, n: int) -> bytes:
    events = [RequestEvent(event_id=f"e-{i:04d}", ts_ms=BASE_MS + i, channel="c", route="r", status="ok",
                           latency_ms=float(i)) for i in range(first, first + n)]
    return event_payload([(e, None, None) for e in events])


def _ids(client) -> list[str]:
    return [r[0] for r in client.query("SELECT event_id FROM channel_health.request_events ORDER BY event_id")
            .result_rows]


def _sink(client, **bounds: int) -> JsonTableSink:
    return JsonTableSink(client, EVENTS_TABLE, via=EVENTS_INPUT_TABLE, **bounds)


class _FailingAt:
    """Delegates to a real client; the ``n``-th raw insert raises ConnectionError."""

    def __init__(self, client, n: int) -> None:
        self.client, self.n, self.calls = client, n, 0

    def raw_insert(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            raise ConnectionError("simulated: connection reset by peer")
        return self.client.raw_insert(*args, **kwargs)


def test_payloads_are_written_in_one_insert_and_bounded(ch) -> None:
    sink = _sink(ch, max_rows=5)
    sink.add_payload(_payload(0, 3), 3)
    with pytest.raises(SinkBackpressure, match="3 rows"):
        sink.add_payload(_payload(3, 3), 3)  # 6 > 5 rows: refused, nothing added
    assert sink.pending_rows == 3 and sink.pending_bytes == len(_payload(0, 3))
    with pytest.raises(ValueError, match="JSON array of rows"):
        sink.add_payload(b'{"event_id": "x"}', 1)
    assert sink.flush() == 3 and sink.pending_rows == 0 and sink.pending_bytes == 0
    assert _ids(ch) == ["e-0000", "e-0001", "e-0002"]


def test_a_payload_clickhouse_cannot_read_is_dropped_and_reported_and_the_others_are_written(ch, caplog) -> None:
    sink = _sink(ch)
    sink.add_payload(_payload(0, 2), 2, tag=1)
    sink.add_payload(UNREADABLE, 1, tag=2)
    sink.add_payload(_payload(2, 3), 3, tag=3)
    assert sink.flush() == 5
    [(tag, rows, reason)] = sink.take_rejected()
    assert (tag, rows) == (2, 1) and "Code: 27" in reason and "\n" not in reason
    assert sink.take_rejected() == [] and sink.rejected_rows == 1 and sink.pending_rows == 0
    assert _ids(ch) == ["e-0000", "e-0001", "e-0002", "e-0003", "e-0004"]
    assert "dropped a payload of 1 rows that ClickHouse cannot read (tag 2)" in caplog.text


def test_an_outage_keeps_every_row_not_yet_written(ch) -> None:
    client = _FailingAt(ch, n=1)
    sink = _sink(client)
    sink.add_payload(_payload(0, 2), 2)
    with pytest.raises(SinkWriteError, match="insert of 2 rows into channel_health.request_events failed: "
                                             "ConnectionError: simulated"):
        sink.flush()
    assert sink.pending_rows == 2 and sink.take_rejected() == []
    assert sink.flush() == 2 and _ids(ch) == ["e-0000", "e-0001"]


def test_an_outage_while_writing_one_by_one_keeps_the_rest(ch) -> None:
    client = _FailingAt(ch, n=3)  # 1: all three (bad data), 2: the first alone, 3: the second alone fails
    sink = _sink(client)
    sink.add_payload(_payload(0, 2), 2, tag="a")
    sink.add_payload(_payload(2, 1), 1, tag="b")
    sink.add_payload(UNREADABLE, 1, tag="c")
    with pytest.raises(SinkWriteError, match="insert of 2 rows"):
        sink.flush()
    assert sink.pending_rows == 2 and _ids(ch) == ["e-0000", "e-0001"]  # "a" written and forgotten
    assert sink.flush() == 1  # "b" written; "c" dropped
    assert [t for t, _, _ in sink.take_rejected()] == ["c"] and _ids(ch) == ["e-0000", "e-0001", "e-0002"]


def test_edge_values_reach_the_table_as_event_row_gives_them(ch) -> None:
    """Quotes, escapes, control characters, non-BMP text, extreme numbers, tool-call objects in an ignored key."""
    weird = 'q"uo\\te\nnl\ttab \u00e9\u4e2d\U0001F600 \x01ctl </script>'
    stored = [
        (RequestEvent(event_id="a-" + weird[:12], ts_ms=BASE_MS + 123, channel="c/\u00fc@free", route="r", status="ok",
                      latency_ms=0.0, expected_fields=[ExpectedCall(function="f", required=["x"]), ExpectedCall("g")],
                      missing_fields=["f"], error_type=weird, trace_id="", gateway_id=weird * 50, quota_remaining=1.0,
                      cost_usd=1e-12, input_tokens=4_294_967_295, http_status=999, ttft_ms=1.7976931348623157e308),
         False, ["f"]),
        (RequestEvent(event_id="b", ts_ms=0, channel="c", route="r", status="error", latency_ms=5e-324,
                      prompt_text="p" * 10_000), None, None),
    ]
    by_rows = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS)
    by_rows.add([event_row(e, ok, miss or [], now_ms()) for e, ok, miss in stored])
    by_rows.flush()
    query = "SELECT * EXCEPT ingested_at FROM channel_health.request_events ORDER BY event_id"
    want = ch.query(query).result_rows
    ch.command("TRUNCATE TABLE channel_health.request_events")
    sink = ClickHouseSink(ch)
    sink.add_events(stored)
    assert sink.flush() == 2
    assert ch.query(query).result_rows == want
    assert want[0][14] == weird and want[1][6] == 5e-324  # error_type, latency_ms


def test_data_error_codes() -> None:
    assert is_data_error(RuntimeError("Code: 72. DB::Exception: Cannot parse number"))
    assert not is_data_error(RuntimeError("Code: 241. DB::Exception: Memory limit (total) exceeded"))
    assert not is_data_error(TimeoutError("timed out"))


def test_the_sink_process_reports_an_unreadable_payload_and_writes_the_rest(tmp_path: Path, caplog) -> None:
    with ProcessSink(_settings(tmp_path / "chdb")) as sink:
        sink.add_events([(RequestEvent(event_id="e-0000", ts_ms=BASE_MS, channel="c", route="r", status="ok",
                                       latency_ms=1.0), None, None)])
        sink._add("events", UNREADABLE, 1, 0)  # as if the worker had encoded a row ClickHouse cannot read
        assert sink.flush() == 1
        assert sink.pending_rows == 0 and sink.rejected["events"] == 1 and sink.written["events"] == 1
    assert "could not buffer or write 1 events rows (payload 2), they are not stored: " in caplog.text
    close_clients()
    try:
        assert _ids(open_client(_settings(tmp_path / "chdb"))) == ["e-0000"]
    finally:
        close_clients()
