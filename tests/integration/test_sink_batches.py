"""``request_events`` from whole batch envelopes (:mod:`pipeline.sinks.batches`) against chDB.

The envelopes ClickHouse reads itself must give exactly the rows the JSON
rows give for the same events (what the pipeline counted), and an envelope
ClickHouse refuses must be written as rows, not dropped.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from pipeline.config import Settings
from pipeline.sinks.clickhouse import ClickHouseSink
from pipeline.sinks.process import ProcessSink
from pipeline.storage.client import close_clients, open_client
from pipeline.storage.schema import apply_ddl
from pipeline.engine.batch import BatchProcessor

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

NOW_MS = int(time.time() * 1000)
T0 = NOW_MS - 3_600_000
ROWS = "SELECT * EXCEPT ingested_at FROM channel_health.request_events FINAL ORDER BY event_id"


def _settings(path: Path) -> Settings:
    return Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{path}")


def _event(i: int, **extra: object) -> bytes:
    doc = {"event_id": f"e{i:02d}", "ts_ms": T0 + i, "channel": f"prov/m-{i % 3}@paid", "route": "chat",
           "status": "ok", "latency_ms": 100 + i, **extra}
    return msgspec.json.encode(doc)


#: Events as gateways may write them: every optional field, integers for floats, the gateway's own
#: structure check in each form, keys the table does not know (nested too), a prompt longer than the
#: decoder keeps, raw UTF-8, spaces; no backslash and no line break (such envelopes are stored as rows:
#: storable_envelope), and flags that say what ingest resolves (else: rows, see RESOLVED).
EVENTS = [
    _event(1),
    _event(2, missing_fields=[], expected_fields=["answer"]),
    _event(3, missing_fields=["a", "b c"], parse_ok=False, expected_fields=["a", "b c"]),
    _event(4, status="error", http_status=503, error_type="upstream 5xx"),
    _event(5, tier="free", gateway_id="gw-é", trace_id="t/5", ttft_ms=12, max_stream_gap_ms=3.5,
           input_tokens=4_294_967_295, output_tokens=0, cost_usd=1.5e-7, quota_remaining=0.25),
    _event(6, expected_fields=[{"function": "f", "required": ["x"]}], extra={"n": [1, {"q": None}]},
           prompt_text="p" * 9_000),
    _event(7, status="timeout", latency_ms=0, tier=None, missing_fields=None, account="acct-a", retry_after_s=20,
           error_message="Incorrect API key provided"),
    b'{ "event_id" : "e08", "ts_ms" : %d, "channel" : "prov/m-0@paid", "route" : "chat", '
    b'"status" : "cancelled", "latency_ms" : 1e2 }' % (T0 + 8),
]


#: Events whose structure flags ingest resolves to something their fields do not state as data: only
#: ok events are judged, and parse_ok without anything checked means nothing.
RESOLVED = [
    _event(9, status="error", missing_fields=["a"], parse_ok=False),
    _event(10, parse_ok=True, expected_fields=["a"]),
]


def _envelopes() -> list[bytes]:
    return [b'{"events":[' + b",".join(EVENTS[:4]) + b"]}", b'{"v": 1, "events": [' + b", ".join(EVENTS[4:]) + b"]}"]


def test_envelopes_store_exactly_the_rows_the_json_rows_store(ch, tmp_path: Path) -> None:
    out = BatchProcessor(clock_ms=lambda: NOW_MS).process(_envelopes())
    assert [n for _, n in out.envelopes] == [4, 4] and out.stored == [] and out.dead_letters == []
    sink = ClickHouseSink(ch)
    sink.add_event_batches(out.envelopes)
    assert sink.flush_counts()["event_batches"] == 8
    got = ch.query(ROWS).result_rows
    # The same messages as rows (the path every other message takes), in a second database.
    close_clients()
    other = open_client(_settings(tmp_path / "rows"))
    apply_ddl(other)
    as_rows = BatchProcessor(clock_ms=lambda: NOW_MS).process([_envelopes()[0] + b"\n", _envelopes()[1] + b"\n"])
    assert as_rows.envelopes == [] and len(as_rows.stored) == 8  # a line break: not storable as it came
    rows_sink = ClickHouseSink(other)
    rows_sink.add_events(as_rows.stored)
    assert rows_sink.flush() == 8
    want = other.query(ROWS).result_rows
    assert got == want
    by_id = {r[0]: r for r in got}
    parse_ok, missing = 17, 18  # positions in EVENT_COLUMNS
    assert [(by_id[f"e0{i}"][parse_ok], by_id[f"e0{i}"][missing]) for i in range(1, 8)] == [
        (None, []), (1, []), (0, ["a", "b c"]), (None, []), (None, []), (None, []), (None, [])]
    assert by_id["e05"][9] == 4_294_967_295 and by_id["e05"][15] == "gw-é" and by_id["e05"][16] == "t/5"
    # error fields (DDL 014), error_class as ingest resolved it (SPEC 4.1), '' for a non-failure
    assert [by_id[f"e0{i}"][22] for i in range(1, 9)] == ["", "", "", "transient", "", "", "credential", ""]
    assert by_id["e07"][19:22] == ("Incorrect API key provided", 20.0, "acct-a")


def test_an_envelope_carries_its_error_classes_and_a_cut_message_goes_as_rows(ch) -> None:
    dead = _event(11, status="error", http_status=403, error_message="余额不足")
    told = _event(12, status="error", http_status=401, error_class="caller")
    ok_told = _event(13, error_class="credential")  # not a failure: no class stored
    out = BatchProcessor(clock_ms=lambda: NOW_MS).process([b'{"events":[' + b",".join([dead, told, ok_told]) + b"]}"])
    assert [n for _, n in out.envelopes] == [3] and out.stored == []
    assert out.envelopes[0][0].endswith(b',"error_classes":["quota_exhausted","caller",null]}')
    sink = ClickHouseSink(ch)
    sink.add_event_batches(out.envelopes)
    assert sink.flush_counts()["event_batches"] == 3
    long = _event(14, status="error", http_status=500, error_message="x" * 600)
    cut = BatchProcessor(clock_ms=lambda: NOW_MS).process([b'{"events":[' + long + b"]}"])
    assert cut.envelopes == [] and len(cut.stored) == 1  # the bytes no longer say what is stored
    sink.add_events(cut.stored)
    assert sink.flush() == 1
    got = ch.query("SELECT event_id, error_class, error_message FROM channel_health.request_events FINAL "
                   "ORDER BY event_id").result_rows
    assert got == [("e11", "quota_exhausted", "余额不足"), ("e12", "caller", None), ("e13", "", None),
                   ("e14", "transient", "x" * 512)]


def test_an_envelope_whose_flags_ingest_resolves_is_stored_as_rows(ch) -> None:
    """The flags are stored as data: an envelope is stored whole only when its bytes state them."""
    out = BatchProcessor(clock_ms=lambda: NOW_MS).process([b'{"events":[' + b",".join([EVENTS[2], *RESOLVED]) + b"]}"])
    assert out.envelopes == [] and [(e.event_id, ok, miss) for e, ok, miss in out.stored] == [
        ("e03", False, ["a", "b c"]), ("e09", None, None), ("e10", None, None)]
    sink = ClickHouseSink(ch)
    sink.add_events(out.stored)
    assert sink.flush() == 3
    flags = ch.query("SELECT event_id, parse_ok, missing_fields FROM channel_health.request_events FINAL "
                     "ORDER BY event_id").result_rows
    assert flags == [("e03", 0, ["a", "b c"]), ("e09", None, []), ("e10", None, [])]


def test_an_envelope_clickhouse_refuses_is_written_as_rows(ch) -> None:
    """A key repeated in an event: msgspec keeps the last value (what the pipeline counted), ClickHouse
    refuses the object; the sink writes that envelope's rows re-encoded and drops nothing."""
    dup = b'{"events":[' + _event(20)[:-1] + b',"latency_ms":7}]}'
    out = BatchProcessor(clock_ms=lambda: NOW_MS).process([_envelopes()[0], dup])
    assert [n for _, n in out.envelopes] == [4, 1]
    sink = ClickHouseSink(ch)
    sink.add_event_batches(out.envelopes[:1])
    sink.flush()
    sink.add_event_batches(out.envelopes[1:])
    assert sink.flush_counts()["event_batches"] == 1
    assert sink.rejected == {"events": 0, "event_batches": 0, "verdicts": 0, "quality_scores": 0,
                             "quality_labels": 0, "overrides": 0} and sink.take_rejected() == []
    rows = dict(ch.query("SELECT event_id, latency_ms FROM channel_health.request_events FINAL").result_rows)
    assert rows == {"e01": 101.0, "e02": 102.0, "e03": 103.0, "e04": 104.0, "e20": 7.0}


def test_the_sink_process_writes_envelopes(tmp_path: Path) -> None:
    out = BatchProcessor(clock_ms=lambda: NOW_MS).process(_envelopes())
    sink = ProcessSink(_settings(tmp_path / "chdb"))
    try:
        sink.add_event_batches(out.envelopes)
        assert sink.flush() == 8
        assert sink.written["event_batches"] == 8 and sink.pending_rows == 0
    finally:
        sink.close()
    close_clients()
    client = open_client(_settings(tmp_path / "chdb"))
    assert client.query("SELECT count() FROM channel_health.request_events FINAL").result_rows[0][0] == 8
