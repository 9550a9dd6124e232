"""``channel_quota_forecast`` (infra/clickhouse/012_quota_forecast.sql) on chDB: the quota curve per
minute and the quota signal's forecast from the verdicts, duplicates counted once."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipeline.contracts import RequestEvent, Verdict
from pipeline.sinks.clickhouse import ClickHouseSink

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

#: 2026-01-01T00:00:00Z, minute aligned.
BASE_MS = 1_767_225_600_000
MIN = 60_000


def _event(i: int, ts_ms: int, channel: str, quota: float | None) -> RequestEvent:
    return RequestEvent(event_id=f"{channel}-{i}", ts_ms=ts_ms, channel=channel, route="chat", status="ok",
                        latency_ms=100.0, quota_remaining=quota)


def _verdict(seq: int, ts_ms: int, channel: str, metrics: dict) -> Verdict:
    return Verdict(channel=channel, route="chat", state="degraded" if metrics.get("quota_exhaustion_s") else "healthy",
                   weight=1.0, reasons=[], metrics=metrics, ts_ms=ts_ms, seq=seq)


def test_quota_curve_and_forecast_per_minute(ch) -> None:
    sink = ClickHouseSink(ch)
    events = [_event(i, BASE_MS + i * 20_000, "q@free", 0.5 - 0.01 * i) for i in range(6)]  # 3 a minute, 2 min
    events += [_event(100 + i, BASE_MS + i * 20_000, "plain@paid", None) for i in range(3)]
    stored = [(e, None, None) for e in events]
    sink.add_events(stored + stored)  # redelivered: counted once
    sink.add_verdicts([
        _verdict(1, BASE_MS + 30_000, "q@free", {"quota_points": 10.0, "quota_drain_per_h": 0.4,
                                                 "quota_exhaustion_s": None}),
        _verdict(2, BASE_MS + 60_000 + 30_000, "q@free", {"quota_points": 12.0, "quota_drain_per_h": 1.2,
                                                          "quota_exhaustion_s": 1440.0}),
        _verdict(3, BASE_MS + 60_000 + 40_000, "q@free", {}),  # a pre-trip verdict without the round's metrics
        _verdict(1, BASE_MS + 30_000, "plain@paid", {"quota_points": 0.0, "quota_drain_per_h": None}),
    ])
    sink.flush()
    rows = ch.query("SELECT channel, minute, quota_min, quota_last, quota_samples, quota_drain_per_h, "
                    "quota_exhaustion_s, quota_exhausted_at, quota_in_30m "
                    "FROM channel_health.channel_quota_forecast ORDER BY channel, minute").result_rows
    utc = timezone.utc
    t0 = datetime(2026, 1, 1, tzinfo=utc)
    assert rows[0][:5] == ("plain@paid", t0, None, None, 0) and rows[0][5:] == (None, None, None, None)
    q0, q1 = rows[1], rows[2]
    assert q0[:5] == ("q@free", t0, pytest.approx(0.48), pytest.approx(0.48), 3)
    assert q0[5] == 0.4 and q0[6] is None and q0[7] is None and q0[8] == pytest.approx(0.28)
    assert q1[:5] == ("q@free", t0 + timedelta(minutes=1), pytest.approx(0.45), pytest.approx(0.45), 3)
    assert q1[5:7] == (1.2, 1440.0)
    assert q1[7] == t0 + timedelta(seconds=90 + 1440)
    assert q1[8] == 0.0  # 0.45 - 0.6: empty within 30 min, floored
