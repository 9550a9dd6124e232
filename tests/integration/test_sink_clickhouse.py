"""ClickHouse schema, storage client and sink against chDB in a temporary directory.

chDB allows one data directory per process: every test opens its own
directory through ``pipeline.storage.client.open_client`` and the fixture
closes it again (``close_clients``), so tests do not collide.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.redaction import Secret
from pipeline.contracts import RequestEvent, Verdict
from pipeline.sinks.clickhouse import (
    ClickHouseSink,
    SinkBackpressure,
    SinkSetupError,
    SinkWriteError,
    TableSink,
    event_row,
    label_row,
    quality_row,
    verdict_row,
)
from pipeline.sinks.rows import EVENT_COLUMNS, EVENTS_TABLE, now_ms
from pipeline.storage.client import chdb_path, close_clients, open_client
from pipeline.storage.errors import StorageConfigError, StorageConnectError
from pipeline.storage.schema import apply_ddl

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: 2026-01-01T00:00:00Z, minute aligned.
BASE_MS = 1_767_225_600_000
TABLES = {"request_events", "channel_minute_stats", "channel_verdicts", "quality_scores", "quality_labels",
          "request_events_input", "request_events_input_mv", "request_event_batches", "request_event_batches_mv",
          "channel_overrides", "drill_runs", "channel_incidents", "request_event_envelopes",
          "request_event_envelopes_mv", "channel_quota_forecast", "request_events_input_v2",
          "request_events_input_v2_mv", "request_event_envelopes_v2", "request_event_envelopes_v2_mv",
          "channel_error_class_minute"}


def _settings(url: str, password: str | None = None) -> Settings:
    return Settings(
        kafka_bootstrap=None, clickhouse_url=url, clickhouse_password=Secret(password) if password else None
    )


def _event(i: int, status: str = "ok", latency_ms: float = 100.0, ts_ms: int | None = None,
           channel: str = "lepton/llama-70b@free", **extra: object) -> RequestEvent:
    return RequestEvent(event_id=f"{channel}-{i}", ts_ms=BASE_MS + i if ts_ms is None else ts_ms, channel=channel,
                        route="chat", status=status, latency_ms=latency_ms, **extra)


def _scalar(client, sql: str):
    return client.query(sql).result_rows[0][0]


# -- schema -------------------------------------------------------------------------------------


def test_apply_ddl_twice_creates_the_tables_once(ch) -> None:
    assert apply_ddl(ch) == ["001_database.sql", "002_request_events.sql", "003_channel_minute_stats.sql",
                             "004_channel_verdicts.sql", "005_quality.sql", "006_request_events_input.sql",
                             "007_request_event_batches.sql", "008_channel_overrides.sql", "009_drill_runs.sql",
                             "010_channel_incidents.sql", "011_request_event_envelopes.sql",
                             "012_quota_forecast.sql", "013_channel_overrides_key_id.sql",
                             "014_error_fields.sql", "015_error_class_minute.sql"]
    tables = {r[0] for r in ch.query("SHOW TABLES FROM channel_health").result_rows}
    assert tables == TABLES
    engines = dict(ch.query("SELECT name, engine FROM system.tables WHERE database = 'channel_health'").result_rows)
    assert engines["request_events"] == "ReplacingMergeTree"
    assert engines["channel_verdicts"] == "ReplacingMergeTree"
    assert engines["channel_minute_stats"] == "View"
    assert engines["request_events_input"] == "Null"
    assert engines["request_events_input_mv"] == "MaterializedView"
    assert engines["request_event_batches"] == "Null"
    assert engines["request_event_batches_mv"] == "MaterializedView"
    assert engines["request_event_envelopes"] == "Null"
    assert engines["request_event_envelopes_mv"] == "MaterializedView"
    assert engines["request_events_input_v2"] == engines["request_event_envelopes_v2"] == "Null"
    assert engines["request_events_input_v2_mv"] == engines["request_event_envelopes_v2_mv"] == "MaterializedView"
    types = dict(ch.query("SELECT name, type FROM system.columns WHERE database = 'channel_health' "
                          "AND table = 'request_events'").result_rows)
    assert {k: types[k] for k in ("error_message", "retry_after_s", "account", "error_class")} == {
        "error_message": "Nullable(String)", "retry_after_s": "Nullable(Float64)",
        "account": "LowCardinality(Nullable(String))", "error_class": "LowCardinality(String)"}
    assert engines["channel_error_class_minute"] == "View"
    assert apply_ddl(ch)[-2] == "014_error_fields.sql"  # the ALTER is idempotent


# -- idempotent events --------------------------------------------------------------------------


def test_events_written_twice_count_once(ch) -> None:
    sink = ClickHouseSink(ch)
    stored = [(_event(i), None, None) for i in range(50)]
    sink.add_events(stored)
    assert sink.flush() == 50
    sink.add_events(stored)  # redelivery after a crash before the offset commit
    assert sink.flush() == 50
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events") == 100
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events FINAL") == 50
    assert _scalar(ch, "SELECT uniqExact(event_id) FROM channel_health.request_events") == 50
    ch.command("OPTIMIZE TABLE channel_health.request_events FINAL")
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events") == 50


def test_duplicates_in_one_insert_collapse_on_read_with_final(ch) -> None:
    """Inserts skip the on-insert merge (INSERT_SETTINGS): both copies land, FINAL reads one."""
    sink = ClickHouseSink(ch)
    stored = [(_event(i), None, None) for i in range(20)]
    sink.add_events(stored)
    sink.add_events(stored)  # redelivered before the flush
    assert sink.flush() == 40
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events") == 40
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events FINAL") == 20


def test_event_row_holds_every_analyst_field(ch) -> None:
    e = _event(7, status="error", latency_ms=812.5, gateway_id="gw-1", trace_id="t-9", tier="free",
               http_status=503, error_type="upstream_5xx", ttft_ms=120.0, max_stream_gap_ms=40.5,
               input_tokens=900, output_tokens=12, cost_usd=0.0021, quota_remaining=0.25,
               error_message="Server Overloaded", retry_after_s=20.5, account="acct-a", error_class="transient")
    sink = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS)
    ingested = now_ms()  # recent: rows ingested over 30 days ago expire (TTL)
    sink.add([event_row(e, False, ["answer", "sources"], ingested)])
    sink.flush()
    result = ch.query("SELECT * FROM channel_health.request_events")
    row = dict(zip(result.column_names, result.result_rows[0]))
    utc = timezone.utc
    assert row == {
        "event_id": "lepton/llama-70b@free-7", "ts": datetime(2026, 1, 1, 0, 0, 0, 7000, tzinfo=utc),
        "channel": "lepton/llama-70b@free", "route": "chat", "tier": "free", "status": "error",
        "latency_ms": 812.5, "ttft_ms": 120.0, "max_stream_gap_ms": 40.5, "input_tokens": 900,
        "output_tokens": 12, "cost_usd": 0.0021, "quota_remaining": 0.25, "http_status": 503,
        "error_type": "upstream_5xx", "gateway_id": "gw-1", "trace_id": "t-9", "parse_ok": 0,
        "missing_fields": ["answer", "sources"], "ingested_at": datetime.fromtimestamp(ingested / 1000, tz=utc),
        "error_message": "Server Overloaded", "retry_after_s": 20.5, "account": "acct-a", "error_class": "transient",
    }


def test_json_event_payload_stores_exactly_what_event_row_stores(ch) -> None:
    full = dict(gateway_id="gw-1", trace_id="t-9", tier="free", http_status=503, error_type="upstream_5xx",
                ttft_ms=120.0, max_stream_gap_ms=40.5, input_tokens=900, output_tokens=12, cost_usd=0.0021,
                quota_remaining=0.25, error_message="余额不足", retry_after_s=3.0, account="acct-a",
                error_class="quota_exhausted")
    stored = [(_event(1, status="error", latency_ms=812.5, **full), False, ["answer", "sources"]),
              (_event(2), None, None), (_event(3), True, []), (_event(4, channel="b/m@paid"), None, [])]
    ingested = now_ms()
    by_rows = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS)
    by_rows.add([event_row(e, ok, miss or [], ingested) for e, ok, miss in stored])
    by_rows.flush()
    rows = ch.query("SELECT * FROM channel_health.request_events ORDER BY event_id").result_rows
    ch.command("TRUNCATE TABLE channel_health.request_events")
    sink = ClickHouseSink(ch)
    sink.add_events(stored)
    assert sink.events.pending_rows == 4 and sink.flush() == 4
    got = ch.query("SELECT * FROM channel_health.request_events ORDER BY event_id").result_rows
    at = EVENT_COLUMNS.index("ingested_at")
    assert [r[:at] + r[at + 1:] for r in got] == [r[:at] + r[at + 1:] for r in rows]
    assert all(0 <= (r[at] - rows[0][at]).total_seconds() < 60 for r in got)  # ingested_at: the time of the insert
    assert [r[-1] for r in got] == ["", "quota_exhausted", "", ""]  # error_class ('' for ok events)
    by_id = {r[0]: r for r in rows}
    two, three = by_id["lepton/llama-70b@free-2"], by_id["lepton/llama-70b@free-3"]
    assert two[7] is None and two[17] is None and three[17] == 1  # ttft_ms NULL; parse_ok NULL / 1
    with pytest.raises(ValueError, match="parse_ok=None"):
        sink.add_events([(_event(5), None, ["answer"])])
    assert sink.events.pending_rows == 0


def test_event_row_refuses_missing_fields_on_an_unchecked_event() -> None:
    with pytest.raises(ValueError, match="parse_ok=None"):
        event_row(_event(1), None, ["answer"], BASE_MS)


def test_retention_follows_ingestion_time_not_event_time(ch) -> None:
    """Replays of old traffic survive; rows ingested over 30 days ago are dropped on merge."""
    sink = ClickHouseSink(ch)
    old_event = _event(1, ts_ms=1_500_000_000_000)  # 2017: a replayed trace
    sink.add_events([(old_event, None, None)])
    sink.flush()
    by_rows = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS)  # a row with an ingestion time 31 days ago
    by_rows.add([event_row(_event(2), None, [], now_ms() - 31 * 86_400_000)])
    by_rows.flush()
    ch.command("OPTIMIZE TABLE channel_health.request_events FINAL")
    ids = [r[0] for r in ch.query("SELECT event_id FROM channel_health.request_events").result_rows]
    assert ids == [old_event.event_id]


# -- minute stats -------------------------------------------------------------------------------


def _minute_stats_events() -> list[tuple[RequestEvent, bool | None, list[str] | None]]:
    m0, m1 = BASE_MS, BASE_MS + 60_000
    rows: list[tuple[RequestEvent, bool | None, list[str] | None]] = []
    structure = [(True, []), (True, []), (True, ["answer"]), (False, []), (None, None), (None, None)]
    for i, (lat, (ok, missing)) in enumerate(zip([100, 200, 300, 400, 500, 600], structure)):
        rows.append((_event(i, "ok", lat, ts_ms=m0 + i * 1000), ok, missing))
    rows.append((_event(10, "error", 50, ts_ms=m0 + 10_000), None, None))
    rows.append((_event(11, "error", 60, ts_ms=m0 + 11_000), None, None))
    rows.append((_event(12, "timeout", 30_000, ts_ms=m0 + 12_000), None, None))
    rows.append((_event(13, "cancelled", 15_000, ts_ms=m0 + 59_999), None, None))
    for i, lat in enumerate([80, 90, 100]):
        rows.append((_event(20 + i, "ok", lat, ts_ms=m1 + i), None, None))
    rows.append((_event(30, "rate_limited", 5, ts_ms=m1 + 30_000), None, None))
    rows.append((_event(31, "filtered", 70, ts_ms=m1 + 31_000), None, None))
    rows.append((_event(40, "error", 10, ts_ms=m0 + 1, channel="other/model@paid"), None, None))
    return rows


def test_minute_stats_exact_and_unchanged_by_duplicates(ch) -> None:
    sink = ClickHouseSink(ch)
    for _ in range(2):  # every event twice
        sink.add_events(_minute_stats_events())
        sink.flush()
    result = ch.query("SELECT * FROM channel_health.channel_minute_stats ORDER BY channel, minute")
    rows = [dict(zip(result.column_names, r)) for r in result.result_rows]
    utc = timezone.utc
    expected = [
        {"channel": "lepton/llama-70b@free", "route": "chat", "minute": datetime(2026, 1, 1, 0, 0, tzinfo=utc),
         "requests": 10, "ok": 6, "errors": 2, "timeouts": 1, "rate_limited": 0, "cancelled": 1, "filtered": 0,
         "failures": 3, "error_rate": 0.3, "p50_latency_ms": 350.0, "p95_latency_ms": 575.0,
         "p99_latency_ms": 595.0, "ok_checked": 4, "ok_missing": 2, "missing_field_rate": 0.5},
        {"channel": "lepton/llama-70b@free", "route": "chat", "minute": datetime(2026, 1, 1, 0, 1, tzinfo=utc),
         "requests": 5, "ok": 3, "errors": 0, "timeouts": 0, "rate_limited": 1, "cancelled": 0, "filtered": 1,
         "failures": 1, "error_rate": 0.2, "p50_latency_ms": 90.0, "p95_latency_ms": 99.0,
         "p99_latency_ms": 99.8, "ok_checked": 0, "ok_missing": 0, "missing_field_rate": None},
        {"channel": "other/model@paid", "route": "chat", "minute": datetime(2026, 1, 1, 0, 0, tzinfo=utc),
         "requests": 1, "ok": 0, "errors": 1, "timeouts": 0, "rate_limited": 0, "cancelled": 0, "filtered": 0,
         "failures": 1, "error_rate": 1.0, "p50_latency_ms": None, "p95_latency_ms": None,
         "p99_latency_ms": None, "ok_checked": 0, "ok_missing": 0, "missing_field_rate": None},
    ]
    for got, want in zip(rows, expected, strict=True):
        for key, value in want.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert got[key] == value, key


# -- timestamps ---------------------------------------------------------------------------------


def test_utc_timestamps_round_trip_exactly(ch) -> None:
    stamps = [BASE_MS + 123, 1_711_846_800_999, 1_700_000_000_001, 946_684_799_999]  # incl. a DST change day
    sink = ClickHouseSink(ch)
    sink.add_events([(_event(i, ts_ms=t), None, None) for i, t in enumerate(stamps)])
    sink.flush()
    got = ch.query("SELECT toUnixTimestamp64Milli(ts), ts FROM channel_health.request_events ORDER BY event_id")
    assert [r[0] for r in got.result_rows] == stamps
    assert [r[1] for r in got.result_rows] == [datetime.fromtimestamp(t / 1000, tz=timezone.utc) for t in stamps]


def test_timestamps_do_not_depend_on_the_local_timezone(tmp_path: Path) -> None:
    """In a process whose local zone is UTC+05:30, an event's ts still stores exactly.

    A subprocess, because chDB fixes its server time zone when the engine first starts in a process.
    """
    script = textwrap.dedent(f"""
        import json
        from pipeline.config import Settings
        from pipeline.contracts import RequestEvent
        from pipeline.sinks.clickhouse import ClickHouseSink
        from pipeline.storage.client import open_client
        from pipeline.storage.schema import apply_ddl
        client = open_client(Settings(kafka_bootstrap=None, clickhouse_url="chdb://{tmp_path / 'tz'}"))
        apply_ddl(client)
        sink = ClickHouseSink(client)
        e = RequestEvent(event_id="e1", ts_ms={BASE_MS + 123}, channel="c", route="r", status="ok", latency_ms=1.0)
        sink.add_events([(e, None, None)])
        sink.flush()
        row = client.query("SELECT serverTimezone(), toUnixTimestamp64Milli(ts), toString(ts), "
                           "toStartOfMinute(ts) FROM channel_health.request_events").result_rows[0]
        stats = client.query("SELECT minute FROM channel_health.channel_minute_stats").result_rows[0][0]
        print(json.dumps([row[0], row[1], row[2], row[3].isoformat(), stats.isoformat()]))
    """)
    env = dict(os.environ, TZ="Asia/Kolkata", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    server_tz, ms, text, minute, stats_minute = json.loads(proc.stdout.strip().splitlines()[-1])
    assert server_tz == "Asia/Kolkata"
    assert ms == BASE_MS + 123
    assert text == "2026-01-01 00:00:00.123"
    assert minute == "2026-01-01T05:30:00+05:30"  # chDB drops the zone of DateTime('UTC') results: same instant
    assert stats_minute == "2026-01-01T00:00:00+00:00"  # the view's minute is DateTime64(3, 'UTC'): stays UTC


# -- verdicts -----------------------------------------------------------------------------------


def _verdict(seq: int, ts_ms: int = BASE_MS, state: str = "degraded") -> Verdict:
    return Verdict(channel="lepton/llama-70b@free", route="chat", state=state, weight=0.85,
                   reasons=["latency_p95_ratio", "missing_fields"],
                   metrics={"p95_ms": 820.0, "p95_baseline_ms": 400.0, "ratio": 2.05, "n": 412, "note": None},
                   ts_ms=ts_ms, seq=seq)


def test_verdicts_written_twice_count_once(ch) -> None:
    sink = ClickHouseSink(ch)
    sink.add_verdicts([_verdict(1), _verdict(2, BASE_MS + 30_000, "open")])
    sink.flush()
    sink.add_verdicts([_verdict(1)])  # republished after a restart
    sink.flush()
    assert _scalar(ch, "SELECT count() FROM channel_health.channel_verdicts") == 3
    rows = ch.query("SELECT seq, state, weight, reasons, metrics, ts, schema_version "
                    "FROM channel_health.channel_verdicts FINAL ORDER BY seq").result_rows
    assert [r[:4] for r in rows] == [(1, "degraded", 0.85, ["latency_p95_ratio", "missing_fields"]),
                                     (2, "open", 0.85, ["latency_p95_ratio", "missing_fields"])]
    assert json.loads(rows[0][4]) == {"n": 412, "note": None, "p95_baseline_ms": 400.0, "p95_ms": 820.0,
                                      "ratio": 2.05}
    assert rows[0][4] == verdict_row(_verdict(1), 0)[5]  # sorted keys: the same verdict, the same text
    assert rows[1][5] == datetime(2026, 1, 1, 0, 0, 30, tzinfo=timezone.utc)
    assert rows[0][6] == 1
    assert _scalar(ch, "SELECT JSONExtractFloat(metrics, 'ratio') FROM channel_health.channel_verdicts "
                       "FINAL WHERE seq = 1") == 2.05


# -- quality tables -----------------------------------------------------------------------------


def test_quality_rows_truncate_text_and_dedupe(ch) -> None:
    sink = ClickHouseSink(ch)
    row = quality_row("e1", BASE_MS, "c", "chat", 0.73, "minilm-v1", "x" * 5000, "why?", max_text_chars=100)
    sink.add_quality_scores([row, row])
    sink.add_quality_labels([label_row("l1", "p", "r", 7, "llm-answers-judged", 1),
                             label_row("l1", "p", "r", 8, "llm-answers-judged", 2)])
    sink.flush()
    got = ch.query("SELECT length(response_text), prompt_text, score, model_version "
                   "FROM channel_health.quality_scores FINAL").result_rows
    assert len(got) == 1
    assert got[0][0] == 100 and got[0][1] == "why?" and got[0][3] == "minilm-v1"
    assert got[0][2] == pytest.approx(0.73, rel=1e-6)  # Float32
    assert ch.query("SELECT label_id, label FROM channel_health.quality_labels FINAL").result_rows == [("l1", 8)]
    with pytest.raises(ValueError, match="outside 0..255"):
        label_row("l2", "p", "r", 256, "x")


# -- failure, retry, backpressure ---------------------------------------------------------------


class FlakyClient:
    """Delegates to a real client but fails the first ``failures`` inserts."""

    def __init__(self, client, failures: int) -> None:
        self.client, self.failures, self.inserts = client, failures, 0

    def _attempt(self) -> None:
        self.inserts += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("simulated: connection reset by peer")

    def insert(self, *args, **kwargs):
        self._attempt()
        return self.client.insert(*args, **kwargs)

    def insert_arrow(self, *args, **kwargs):
        self._attempt()
        return self.client.insert_arrow(*args, **kwargs)

    def raw_insert(self, *args, **kwargs):
        self._attempt()
        return self.client.raw_insert(*args, **kwargs)

    def query(self, *args, **kwargs):
        return self.client.query(*args, **kwargs)


def test_failed_flush_keeps_the_buffer_and_retry_writes_it(ch) -> None:
    flaky = FlakyClient(ch, failures=2)
    sink = ClickHouseSink(flaky)
    sink.add_events([(_event(i), None, None) for i in range(10)])
    with pytest.raises(SinkWriteError, match="insert of 10 rows into channel_health.request_events failed: "
                                             "ConnectionError: simulated") as info:
        sink.flush()
    assert (info.value.table, info.value.rows, info.value.attempts) == ("channel_health.request_events", 10, 1)
    assert sink.pending_rows == 10
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events") == 0
    sleeps: list[float] = []
    assert sink.flush_with_retry(10.0, initial_backoff_s=0.5, sleep=sleeps.append) == 10
    assert sleeps == [0.5]  # one more failure, then success
    assert sink.pending_rows == 0
    assert _scalar(ch, "SELECT count() FROM channel_health.request_events") == 10


def test_flush_with_retry_gives_up_after_max_wait(ch) -> None:
    sink = TableSink(FlakyClient(ch, failures=10**9), EVENTS_TABLE, EVENT_COLUMNS)
    sink.add([event_row(_event(1), None, [], BASE_MS)])
    now = [0.0]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    with pytest.raises(SinkWriteError, match="gave up after 6 attempts in 3s") as info:
        sink.flush_with_retry(3.0, initial_backoff_s=0.25, max_backoff_s=1.0, sleep=sleep, clock=lambda: now[0])
    assert sleeps == [0.25, 0.5, 1.0, 1.0, 0.25]  # doubling, capped at 1 s, the last wait cut to the deadline
    assert info.value.attempts == 6
    assert sink.pending_rows == 1


def test_async_flush_with_retry(ch) -> None:
    sink = ClickHouseSink(FlakyClient(ch, failures=1))
    sink.add_verdicts([_verdict(1)])
    assert asyncio.run(sink.aflush_with_retry(5.0, initial_backoff_s=0.01)) == 1
    assert _scalar(ch, "SELECT count() FROM channel_health.channel_verdicts") == 1


def test_backpressure_by_rows_and_bytes(ch) -> None:
    sink = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS, max_rows=5)
    rows = [event_row(_event(i), None, [], BASE_MS) for i in range(6)]
    sink.add(rows[:3])
    with pytest.raises(SinkBackpressure, match="3 rows .* bounds 5 rows") as info:
        sink.add(rows[3:6])
    assert (info.value.pending_rows, info.value.max_rows) == (3, 5)
    assert sink.pending_rows == 3  # the refused rows were not buffered
    assert sink.flush() == 3
    sink.add(rows[3:6])  # after the flush they fit
    assert sink.pending_rows == 3

    by_bytes = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS, max_bytes=1000)
    big = event_row(_event(99, error_type="e" * 2000), None, [], BASE_MS)
    by_bytes.add([big])  # an oversized batch into an empty buffer is accepted
    with pytest.raises(SinkBackpressure):
        by_bytes.add(rows[:1])
    assert by_bytes.pending_rows == 1 and by_bytes.pending_bytes > 2000


def test_sink_on_missing_table_is_a_setup_error(ch) -> None:
    with pytest.raises(SinkSetupError, match="cannot describe channel_health.nope"):
        TableSink(ch, "channel_health.nope", ["a"])
    with pytest.raises(SinkSetupError, match=r"lacks columns \['nope'\]"):
        TableSink(ch, EVENTS_TABLE, ["event_id", "nope"])


def test_wrong_row_width_is_refused(ch) -> None:
    sink = TableSink(ch, EVENTS_TABLE, EVENT_COLUMNS)
    with pytest.raises(ValueError, match="row has 2 values, expected 24"):
        sink.add([("a", 1)])
    assert sink.pending_rows == 0


# -- storage client -----------------------------------------------------------------------------


def test_same_chdb_path_reuses_one_client_and_another_path_is_refused(ch, tmp_path: Path) -> None:
    again = open_client(_settings(f"chdb://{tmp_path / 'chdb'}/"))  # another spelling of the same directory
    assert again is ch
    with pytest.raises(StorageConnectError, match="allows one data directory per process"):
        open_client(_settings(f"chdb://{tmp_path / 'other'}"))


def test_chdb_urls() -> None:
    assert chdb_path("chdb:///var/lib/x") == Path("/var/lib/x")
    assert chdb_path("chdb://./data/chdb") == Path.cwd() / "data" / "chdb"
    with pytest.raises(StorageConfigError, match="names no directory"):
        chdb_path("chdb://")
    with pytest.raises(StorageConfigError, match="query or fragment"):
        chdb_path("chdb:///x?y=1")


def test_http_errors_never_show_the_password() -> None:
    with pytest.raises(StorageConfigError, match="given both") as both:
        open_client(_settings("http://bob:hunter2@127.0.0.1:1/channel_health", password="s3cret-pw"))
    assert "hunter2" not in str(both.value) and "s3cret-pw" not in str(both.value)
    with pytest.raises(StorageConfigError, match="names database 'other'"):
        open_client(_settings("http://bob:hunter2@127.0.0.1:1/other"))
    with pytest.raises(StorageConnectError) as refused:  # nothing listens on port 1
        open_client(_settings("http://bob@127.0.0.1:1/channel_health", password="s3cret-pw"), timeout_s=2)
    message = str(refused.value)
    assert message.startswith("cannot connect to ClickHouse at http://bob@127.0.0.1:1/channel_health: ")
    assert "s3cret-pw" not in message and refused.value.__cause__ is None
    with pytest.raises(StorageConnectError) as in_url:
        open_client(_settings("http://bob:hunter2@127.0.0.1:1/"), timeout_s=2)
    assert "http://bob:***@127.0.0.1:1/" in str(in_url.value) and "hunter2" not in str(in_url.value)


def test_chdb_directory_with_a_space(tmp_path: Path) -> None:
    close_clients()
    try:
        client = open_client(_settings(f"chdb://{tmp_path / 'my data' / 'ch'}"))
        assert client.path == str(tmp_path / "my data" / "ch")
        assert (tmp_path / "my data" / "ch").is_dir()
        assert client.query("SELECT currentDatabase()").result_rows == [("channel_health",)]
    finally:
        close_clients()
