"""The report's ``--incident`` window (issue #21): first unhealthy verdict to the return to healthy."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipeline.tools.report.data import ReportError, incident_window

T = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def _rows(*spec: tuple[int, str, str]) -> list[dict]:
    return [{"ts": T + timedelta(seconds=s), "channel": c, "state": st} for s, c, st in spec]


def test_window_spans_first_unhealthy_to_return_of_the_last_channel_with_margins() -> None:
    rows = _rows((0, "a", "healthy"), (95, "a", "degraded"), (120, "b", "open"), (300, "a", "healthy"),
                 (400, "b", "half_open"), (500, "b", "healthy"), (900, "a", "open"))
    t0, t1 = incident_window(rows, margin=timedelta(minutes=10))
    assert t0 == datetime(2026, 1, 1, 11, 51, 0, tzinfo=timezone.utc)  # 12:01:35 - 10 min, floored to the minute
    assert t1 == T + timedelta(seconds=500 + 600)  # the second incident (900 s) is not part of it


def test_window_without_return_ends_at_the_last_verdict() -> None:
    rows = _rows((0, "a", "healthy"), (60, "a", "open"), (90, "a", "half_open"))
    assert incident_window(rows, margin=timedelta(0)) == (T + timedelta(seconds=60), T + timedelta(seconds=90))


def test_no_incident_says_so() -> None:
    with pytest.raises(ReportError, match="no incident"):
        incident_window(_rows((0, "a", "healthy"), (30, "a", "no_data")))
