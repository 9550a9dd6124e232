"""The ClickHouse sink in its own process (:mod:`pipeline.sinks.process`) against chDB.

The sink process holds the chDB directory while it runs; each test closes it
before reading the tables in this process (chDB: one process per directory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest

from pipeline.config import ConfigError, Settings, load_settings
from pipeline.contracts import RequestEvent, Verdict
from pipeline.sinks.child import serve
from pipeline.sinks.errors import SinkBackpressure, SinkError, SinkWriteError
from pipeline.sinks.process import ProcessSink
from pipeline.sinks.rows import EVENT_COLUMNS, event_row, label_row, now_ms, quality_row, verdict_row
from pipeline.storage.client import close_clients, open_client
from pipeline.storage.errors import StorageError

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
INGESTED_MS = now_ms()  # recent: rows ingested long ago fall to the tables' TTL


def _settings(path: Path, **extra: object) -> Settings:
    return Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{path}", **extra)


def _event(i: int, **extra: object) -> RequestEvent:
    return RequestEvent(event_id=f"e-{i:04d}", ts_ms=BASE_MS + i, channel="lepton/llama-70b@free", route="chat",
                        status="ok", latency_ms=100.0 + i, **extra)


def _read(path: Path, sql: str) -> list[tuple]:
    """Rows of ``sql`` on the chDB directory (after the sink process closed it)."""
    close_clients()
    try:
        return open_client(_settings(path)).query(sql).result_rows
    finally:
        close_clients()


def _wait_for(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached within {timeout_s} s"
        time.sleep(0.05)


def test_rows_written_by_the_sink_process_are_the_in_process_rows(tmp_path: Path) -> None:
    full = dict(gateway_id="gw-1", trace_id="t-9", tier="free", http_status=503, error_type="upstream_5xx",
                ttft_ms=120.0, max_stream_gap_ms=40.5, input_tokens=900, output_tokens=12, cost_usd=0.0021,
                quota_remaining=0.25, response_text="not stored", expected_fields=["answer"])
    stored = [(_event(1, **full), False, ["answer"]), (_event(2), None, None), (_event(3), True, [])]
    verdict = Verdict(channel="lepton/llama-70b@free", route="chat", state="open", weight=0.0,
                      reasons=["error_rate"], metrics={"error_rate_1m": 0.31, "n": 200}, ts_ms=BASE_MS, seq=7)
    score = quality_row("e-0001", BASE_MS, "lepton/llama-70b@free", "chat", 0.42, "v1", "text", "prompt", INGESTED_MS)
    label = label_row("l1", "p", "r", 1, "judged", INGESTED_MS)
    with ProcessSink(_settings(tmp_path / "ch")) as sink:
        sink.add_events(stored)
        sink.add_verdicts([verdict])
        sink.add_quality_scores([score])
        sink.add_quality_labels([label])
        assert sink.pending_rows == 6
        assert sink.flush() == 6
        assert sink.pending_rows == 0 and sink.written == {"events": 3, "event_batches": 0, "verdicts": 1,
                                                           "quality_scores": 1, "quality_labels": 1, "overrides": 0}
    events = _read(tmp_path / "ch", "SELECT * EXCEPT (ts, ingested_at), toUnixTimestamp64Milli(ts), "
                                    "toUnixTimestamp64Milli(ingested_at) FROM channel_health.request_events "
                                    "ORDER BY event_id")
    expected = [event_row(e, ok, miss or [], 0) for e, ok, miss in stored]
    # the query moves ts and ingested_at to the end, as epoch ms
    ts_at, ingested_at = EVENT_COLUMNS.index("ts"), EVENT_COLUMNS.index("ingested_at")
    assert [r[:-1] for r in events] == [(*(v for i, v in enumerate(r) if i not in (ts_at, ingested_at)), r[ts_at])
                                        for r in expected]
    assert all(INGESTED_MS <= r[-1] <= now_ms() for r in events)  # ingested_at: the time of the insert
    verdicts = _read(tmp_path / "ch", "SELECT channel, state, weight, reasons, metrics, seq, "
                                      "toUnixTimestamp64Milli(ts) FROM channel_health.channel_verdicts")
    row = verdict_row(verdict, INGESTED_MS)
    assert verdicts == [(row[0], row[2], row[3], row[4], row[5], row[7], BASE_MS)]
    [(score_value, text)] = _read(tmp_path / "ch", "SELECT score, response_text FROM channel_health.quality_scores")
    assert text == "text" and score_value == pytest.approx(0.42, abs=1e-6)  # a Float32 column
    assert _read(tmp_path / "ch", "SELECT label_id, label FROM channel_health.quality_labels") == [("l1", 1)]


def test_a_killed_sink_process_is_restarted_with_every_unwritten_row(tmp_path: Path) -> None:
    with ProcessSink(_settings(tmp_path / "ch")) as sink:
        sink.add_events([(_event(i), None, None) for i in range(100)])
        assert sink.flush() == 100
        sink.add_events([(_event(i), None, None) for i in range(100, 130)])
        first = sink.pid
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: psutil.Process(first).status() == psutil.STATUS_ZOMBIE)  # dead, not reaped
        with pytest.raises(SinkWriteError, match=r"was killed by SIGKILL before writing; started a new one with the 30 "):
            sink.flush()
        assert sink.restarts == 1 and sink.pid != first and sink.pending_rows == 30
        assert sink.flush() == 30 and sink.pending_rows == 0
        assert sink.written["events"] == 130
    assert _read(tmp_path / "ch", "SELECT count() FROM channel_health.request_events FINAL") == [(130,)]


def test_rows_are_kept_while_a_sink_process_cannot_start_again(tmp_path: Path) -> None:
    data, aside = tmp_path / "ch", tmp_path / "aside"
    with ProcessSink(_settings(data)) as sink:
        sink.add_events([(_event(i), None, None) for i in range(10)])
        first = sink.pid
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: psutil.Process(first).status() == psutil.STATUS_ZOMBIE)
        data.rename(aside)
        data.write_text("a file where the chDB directory was")
        with pytest.raises(SinkWriteError, match="a new sink process could not start: StorageConnectError"):
            sink.flush()
        assert sink.pid is None and sink.pending_rows == 10
        sink.add_events([(_event(i), None, None) for i in range(10, 15)])  # kept only
        data.unlink()
        aside.rename(data)
        with pytest.raises(SinkWriteError, match="no sink process was running .* started a new one with the 15 unwritten"):
            sink.flush()
        assert sink.flush() == 15 and sink.restarts == 1
    assert _read(data, "SELECT count() FROM channel_health.request_events FINAL") == [(15,)]


def test_backpressure_and_refused_rows_leave_nothing_pending(tmp_path: Path) -> None:
    with ProcessSink(_settings(tmp_path / "ch"), max_rows=10) as sink:
        sink.add_events([(_event(i), None, None) for i in range(8)])
        with pytest.raises(SinkBackpressure, match="8 rows"):
            sink.add_events([(_event(i), None, None) for i in range(8, 13)])
        with pytest.raises(ValueError, match="parse_ok=None"):
            sink.add_events([(_event(20), None, ["answer"])])
        assert sink.pending_rows == 8
        assert sink.flush() == 8
        sink.add_events([(_event(i), None, None) for i in range(8, 13)])  # accepted once drained
        assert sink.flush() == 5
    with pytest.raises(SinkError, match="closed"):
        sink.add_events([(_event(30), None, None)])


def test_a_clickhouse_outage_keeps_the_rows_until_a_flush_succeeds(tmp_path: Path) -> None:
    down = tmp_path / "down"
    down.touch()
    with ProcessSink(_settings(tmp_path / "ch", fault_sink_down_file=str(down))) as sink:
        sink.add_events([(_event(i), None, None) for i in range(5)])
        for _ in range(2):
            with pytest.raises(SinkWriteError, match="request_events"):
                sink.flush()
        assert sink.pending_rows == 5
        down.unlink()
        assert sink.flush() == 5 and sink.written["events"] == 5
    assert _read(tmp_path / "ch", "SELECT count() FROM channel_health.request_events") == [(5,)]


def test_a_storage_error_of_the_sink_process_is_raised_where_the_sink_is_opened(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageError, match="file"):
        ProcessSink(_settings(tmp_path / "file" / "ch"))


def test_the_sink_process_exits_with_its_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os
        from pipeline.config import Settings
        from pipeline.sinks.process import ProcessSink
        sink = ProcessSink(Settings(kafka_bootstrap=None, clickhouse_url="chdb://{tmp_path / 'ch'}"))
        print(sink.pid, flush=True)
        os._exit(0)  # no close(), no atexit: as if the worker was killed
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    pid = int(out.stdout.split()[0])
    _wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    assert _read(tmp_path / "ch", "SELECT count() FROM channel_health.request_events") == [(0,)]  # directory free


class _RecordingSink:
    """Buffers payloads; at a flush, one that is b"unreadable" is dropped as ClickHouse would (take_rejected).

    ``failures``: that many flushes raise first; ``flushes`` counts the flush calls.
    """

    def __init__(self, failures: int = 0) -> None:
        self.added: list[tuple[int, bytes]] = []
        self.dropped: list[tuple[int, str, int, str]] = []
        self.failures, self.flushes = failures, 0

    @property
    def pending_rows(self) -> int:
        return len(self.added)

    def flush_counts(self) -> dict[str, int]:
        self.flushes += 1
        if self.failures:
            self.failures -= 1
            raise ConnectionError("ClickHouse unreachable")
        self.dropped += [(seq, "events", 1, "bad data") for seq, p in self.added if p == b"unreadable"]
        n = sum(p != b"unreadable" for _, p in self.added)
        self.added = []
        return {"events": n}

    def take_rejected(self) -> list[tuple[int, str, int, str]]:
        out, self.dropped = self.dropped, []
        return out


def _record(sink: _RecordingSink, payload: bytes, at: int, rows: int, seq: int) -> None:
    if payload == b"bad":
        raise TypeError("boom")
    sink.added.append((seq, payload))


def test_a_payload_the_sink_process_cannot_buffer_or_write_is_reported_once_and_the_rest_is_written() -> None:
    inbox = [("add", 1, "events", 0, 1, b"ok"), ("flush", 1), ("add", 2, "events", 0, 1, b"bad"),
             ("add", 3, "events", 0, 1, b"ok"), ("add", 4, "events", 0, 1, b"unreadable"), ("flush", 4),
             ("flush", 4), ("close",)]
    replies: list[tuple] = []
    serve(iter(inbox).__next__, replies.append, _RecordingSink(), {"events": _record})
    assert replies == [("flushed", 1, {"events": 1}, []),
                       ("flushed", 4, {"events": 1}, [(2, "events", "TypeError: boom"), (4, "events", "bad data")]),
                       ("flushed", 4, {"events": 0}, [])]


def test_the_sink_process_writes_on_its_own_and_reports_those_rows_with_the_next_flush() -> None:
    adds = [("add", seq, "events", 0, 1, b"ok") for seq in range(1, 6)]
    inbox = adds + [("flush", 5), ("close",)]
    replies: list[tuple] = []
    sink = _RecordingSink()
    serve(iter(inbox).__next__, replies.append, sink, {"events": _record}, autoflush_rows=2)
    assert sink.flushes == 3  # after the 2nd and the 4th add, then the 5th row on request
    assert replies == [("flushed", 5, {"events": 5}, [])]


def test_after_a_failed_automatic_write_the_sink_process_waits_for_the_flush_request() -> None:
    adds = [("add", seq, "events", 0, 1, b"ok") for seq in range(1, 5)]
    inbox = adds + [("flush", 4), ("add", 5, "events", 0, 1, b"ok"), ("add", 6, "events", 0, 1, b"ok"),
                    ("flush", 6), ("close",)]
    replies: list[tuple] = []
    sink = _RecordingSink(failures=1)
    serve(iter(inbox).__next__, replies.append, sink, {"events": _record}, autoflush_rows=2)
    # 2nd add: automatic write fails -> none until the request at seq 4, which writes all four; then
    # automatic again after the 6th add, and the request at seq 6 finds nothing left
    assert sink.flushes == 4
    assert replies == [("flushed", 4, {"events": 4}, []), ("flushed", 6, {"events": 2}, [])]


def test_rows_the_sink_process_refuses_are_logged_counted_and_dropped(tmp_path: Path, caplog) -> None:
    good = quality_row("e-0001", BASE_MS, "c", "chat", 0.5, "v1", "a", "q", INGESTED_MS)
    with ProcessSink(_settings(tmp_path / "ch")) as sink:
        sink.add_quality_scores([("e-0002", BASE_MS)])  # two values for a nine-column table
        sink.add_quality_scores([good])
        assert sink.pending_rows == 2
        assert sink.flush() == 1
        assert sink.pending_rows == 0 and sink.rejected["quality_scores"] == 1 and sink.written["quality_scores"] == 1
    assert "could not buffer or write 1 quality_scores rows (payload 1), they are not stored: ValueError" in caplog.text
    assert _read(tmp_path / "ch", "SELECT event_id FROM channel_health.quality_scores") == [("e-0001",)]


def test_texts_are_not_shipped_to_the_sink_process(tmp_path: Path) -> None:
    long = dict(response_text="x" * 50_000, prompt_text="y" * 50_000, expected_fields=["answer"])
    with ProcessSink(_settings(tmp_path / "ch"), max_bytes=20_000) as sink:
        stored = [(_event(1, **long), True, [])]
        sink.add_events(stored)
        sink.add_events([(_event(2, **long), True, [])])  # would exceed 20,000 bytes with the texts
        assert stored[0][0].response_text == "x" * 50_000  # the caller's events are not changed
        assert sink.flush() == 2


def test_sink_process_setting() -> None:
    assert load_settings({}).sink_process is True
    assert load_settings({"CHANNEL_HEALTH_SINK_PROCESS": "off"}).sink_process is False
    assert load_settings({"CHANNEL_HEALTH_SINK_PROCESS": " ON "}).sink_process is True
    with pytest.raises(ConfigError, match="SINK_PROCESS must be one of"):
        load_settings({"CHANNEL_HEALTH_SINK_PROCESS": "sometimes"})


def test_the_sink_process_gets_the_clickhouse_settings_only() -> None:
    from dataclasses import dataclass

    from pipeline.config import KafkaSecurity
    from pipeline.redaction import Secret
    from pipeline.sinks.link import clickhouse_part

    @dataclass(frozen=True)
    class Local(Settings):  # e.g. defined in a script's __main__, which the sink process cannot import
        extra: int = 1

    s = Local(kafka_bootstrap="broker:9092", clickhouse_url="chdb:///x", sink_max_rows=7,
              kafka_security=KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u",
                                           sasl_password=Secret("kafka-secret")))
    part = clickhouse_part(s)
    assert type(part) is Settings and part.kafka_security == KafkaSecurity() and part.kafka_bootstrap is None
    assert (part.clickhouse_url, part.sink_max_rows) == ("chdb:///x", 7)


def test_start_errors_keep_their_class_when_it_is_ours() -> None:
    from pipeline.sinks.errors import SinkSetupError
    from pipeline.sinks.link import _setup_error
    from pipeline.storage.errors import StorageConnectError

    err = _setup_error("pipeline.storage.errors.StorageConnectError", "cannot open /x")
    assert type(err) is StorageConnectError and str(err) == "cannot open /x"
    other = _setup_error("chdb.SomethingElse", "boom")
    assert type(other) is SinkSetupError and str(other) == "SomethingElse: boom"
