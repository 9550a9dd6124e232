"""``channel_error_class_minute`` (infra/clickhouse/015_error_class_minute.sql) on chDB: failed requests per
channel, minute and error class (issue #32 part 3), duplicates counted once."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from pipeline.contracts import RequestEvent
from pipeline.ingest.error_class import resolve_errors
from pipeline.sinks.clickhouse import ClickHouseSink

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

#: 2026-01-01T00:00:00Z, minute aligned.
BASE_MS = 1_767_225_600_000


def _event(i: int, status: str = "ok", http: int | None = None, message: str | None = None) -> RequestEvent:
    return RequestEvent(event_id=f"e-{i}", ts_ms=BASE_MS + i * 1_000, channel="openai/gpt-4o@paid", route="chat",
                        status=status, latency_ms=100.0, http_status=http, error_message=message,
                        account="acct-a" if http == 401 else None)  # type: ignore[arg-type]


def test_failures_per_minute_and_class(ch) -> None:
    events = [_event(i) for i in range(10)]
    events += [_event(10 + i, "error", 400, "maximum context length is 8192 tokens") for i in range(3)]
    events += [_event(20 + i, "error", 401, f"Incorrect API key provided #{i}") for i in range(2)]
    events += [_event(30, "rate_limited", 429), _event(31, "error", 503)]
    resolve_errors(events)  # what ingest does
    stored = [(e, None, None) for e in events]
    sink = ClickHouseSink(ch)
    sink.add_events(stored + stored)  # redelivered: counted once
    sink.flush()
    rows = ch.query("SELECT minute, error_class, failures, share, last_account, last_message "
                    "FROM channel_health.channel_error_class_minute ORDER BY error_class").result_rows
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (t0, "caller", 3), (t0, "credential", 2), (t0, "rate_limited", 1), (t0, "transient", 1)]
    assert [r[3] for r in rows] == [pytest.approx(3 / 17), pytest.approx(2 / 17), pytest.approx(1 / 17),
                                    pytest.approx(1 / 17)]
    assert rows[1][4:] == ("acct-a", "Incorrect API key provided #1")  # the newest of the minute
