"""The report's impact, time to detect and recover, band end, overrides and time notation (issue #35 part 4)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.cli.report import _when, window_line
from pipeline.tools.report.data import VERDICT_METRICS, ReportData, iso_utc
from pipeline.tools.report.impact import incident_impact

T0 = datetime(2026, 5, 28, 21, 0, tzinfo=timezone.utc)
CH = "creep/llama-70b@paid"
M = timedelta(minutes=1)


def _data() -> ReportData:
    """20 minutes of 100 requests/min: 1 % errors (baseline) until minute 8, 10 % from minute 8 to 14; P95
    171 ms, 400 ms (over 1.8 x 171 = 307.8) in minutes 9 and 10. Verdicts each minute: open at 10:30 (minute
    10.5), half_open at minute 13, healthy at minute 15; the window runs 30 min past the data (--incident)."""
    d = ReportData(f"channel {CH}", [CH], T0 - 30 * M, T0 + 50 * M)
    for i in range(20):
        bad = 8 <= i < 14
        d.minutes.append({"channel": CH, "minute": T0 + i * M, "requests": 100, "failures": 10 if bad else 1,
                          "error_rate": 0.10 if bad else 0.01, "p95_latency_ms": 400.0 if i in (9, 10) else 171.0,
                          "missing_field_rate": None})
    states = {**{i: "healthy" for i in range(20)}, 10: "open", 11: "open", 12: "open", 13: "half_open",
              14: "half_open"}
    for i in range(20):
        ts = T0 + i * M + (30 * timedelta(seconds=1) if i == 10 else timedelta(0))
        d.verdicts.append({"channel": CH, "route": "creep", "ts": ts, "seq": i, "state": states[i], "weight": 1.0,
                           "reasons": [], "error_rate_trip": 0.05, "baseline_p95_ms": 171.0,
                           "error_baseline_rate": 0.01, **{k: None for k in VERDICT_METRICS
                                                            if k not in ("error_rate_trip", "baseline_p95_ms")}})
    return d


def test_time_to_detect_recover_and_the_requests_hit() -> None:
    i = incident_impact(_data(), CH)
    assert i is not None
    assert (i.onset, i.detected, i.recovered) == (T0 + 8 * M, T0 + 10 * M + timedelta(seconds=30), T0 + 15 * M)
    assert (i.detect_s, i.recover_s) == (150.0, 270.0)
    # minutes 8..14 (onset to recovery): 7 minutes x 100 requests, 6 x 10 + 1 x 1 failures
    assert (i.requests, i.failed) == (700, 61)
    assert i.excess_failed == 61 - 7  # 1 % of 700 expected at the baseline
    assert i.slowed == 200  # minutes 9 and 10 over the latency line


def test_no_incident_no_impact_and_the_band_stops_at_the_data() -> None:
    d = _data()
    assert d.data_end() == T0 + 20 * M  # the last minute row ends there, not at the window's end (T0 + 50 min)
    for v in d.verdicts:
        v["state"] = "healthy"
    assert incident_impact(d, CH) is None


def test_the_state_band_ends_where_the_data_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from pipeline.tools.report import plots

    spans: list[tuple] = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.axvspan
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan",
                        lambda self, a, b, **k: spans.append((a, b)) or real(self, a, b, **k))
    plots.state_bands(_data())
    assert spans[-1] == (T0 + 19 * M, T0 + 20 * M)  # the old band ran to T0 + 50 min


def test_window_line_names_the_absolute_utc_start_and_the_figures() -> None:
    assert window_line(_data()) == (
        "window 2026-05-28T20:30:00Z to 2026-05-28T21:50:00Z (UTC, event time; data until 2026-05-28T21:20:00Z)\n"
        f"{CH}: detected 2026-05-28T21:10:30Z, time to detect 150 s, to recover 270 s; 61 of 700 requests failed, "
        "200 in slow minutes")
    assert iso_utc(datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))) == "2025-12-31T23:00:00Z"


def test_report_takes_the_time_forms_of_backtest() -> None:
    now = int(T0.timestamp() * 1000)
    assert _when("-2h", "--from", now) == T0 - timedelta(hours=2)
    assert _when("now", "--to", now) == T0
    assert _when("2026-05-28T21:00:00", "--from", now) == T0  # no zone: UTC, as before
    assert _when("2026-05-28T23:00:00+02:00", "--from", now) == T0
    assert _when(str(now), "--from", now) == T0
    r = CliRunner().invoke(app, ["report", "--channel", "c", "--from", "yesterday", "--out", "/tmp/x.html"])
    assert r.exit_code == 2 and "--from: cannot read time 'yesterday'" in r.output


def test_html_has_the_impact_and_overrides_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from pipeline.tools.report import html

    monkeypatch.setattr(html, "PLOTS", ())
    d = _data()
    d.overrides = [{"at": T0 + 11 * M, "action": "set", "kind": "open", "channel": CH, "route": "", "weight": None,
                    "by": "ana", "key_id": "", "reason": "<b>vendor</b>", "expires_ts": T0 + 41 * M}]
    page = html.render_html(d, "chdb://x")
    assert '<table id="impact">' in page and "<td class=\"num\">2.5 min</td>" in page and "4.5 min" in page
    assert '<table id="overrides">' in page and "&lt;b&gt;vendor&lt;/b&gt;" in page and "unsigned" in page
    assert "Window (UTC, event time): <b>2026-05-28T20:30:00Z</b>" in page


def test_lines_come_from_the_first_verdict_that_carries_them() -> None:
    """A consecutive-failure pre-trip verdict carries no metrics (seen on the recovery demo): the onset and the
    excess still come from the next verdict's lines."""
    d = _data()
    for k in ("error_rate_trip", "baseline_p95_ms", "error_baseline_rate"):
        d.verdicts[10][k] = None
    i = incident_impact(d, CH)
    assert i is not None and i.onset == T0 + 8 * M and i.excess_failed == 54 and i.slowed == 200
