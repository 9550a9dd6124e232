"""The report's quota plot: the per-minute curve and, where the quota signal judged, its 30 min forecast."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

pytest.importorskip("matplotlib")

from pipeline.tools.report import plots  # noqa: E402
from pipeline.tools.report.data import ReportData  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _data(with_forecast: bool) -> ReportData:
    d = ReportData("channel q@free", ["q@free"], T0, T0 + timedelta(minutes=10))
    d.extras = [{"channel": "q@free", "minute": T0 + timedelta(minutes=i), "quota_remaining_min": 0.5 - 0.02 * i,
                 "max_stream_gap_ms": None} for i in range(10)]
    d.verdicts = [{"channel": "q@free", "ts": T0 + timedelta(minutes=i), "quota_remaining": 0.5 - 0.02 * i,
                   "quota_drain_per_h": 1.2 if with_forecast else None} for i in range(10)]
    return d


def test_quota_plot_draws_the_forecast_where_the_signal_judged(monkeypatch):
    drawn = []
    real = plots._lines
    monkeypatch.setattr(plots, "_lines", lambda data, rows, x, y, ax, *a, **k: drawn.append(
        (y, [r[y] for r in rows])) or real(data, rows, x, y, ax, *a, **k))
    title, png, _ = plots.quota(_data(True))
    assert title == "Quota remaining" and png[:4] == b"\x89PNG"
    # 0.5 - 0.6 floored at 0, ..., 0.32 - 0.6: the forecast in 30 min is empty throughout
    assert drawn[1] == ("in_30m", [0.0] * 10)
    title, _, _ = plots.quota(_data(False))
    assert title == "Quota remaining (no forecast: quota not judged)"
