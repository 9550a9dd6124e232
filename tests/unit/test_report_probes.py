"""The report's probe schedule (issue #33 part 3: "the report shows the schedule"): each open with its attempt
in the series and the cooldown the worker published (SPEC §4.2: 90 s doubling to 15 min, jitter; reset after
a full recovery)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from pipeline.contracts import Verdict
from pipeline.policy.defaults import PolicyConfig
from pipeline.tools.report.data import VERDICT_METRICS, ReportData
from pipeline.tools.report.html import render_html
from pipeline.tools.report.probes import ANSWERED, probe_schedule, schedule_text

POLICY = PolicyConfig()
END_MS = 1_750_032_000_000


def _row(v: Verdict) -> dict:
    """A verdict as :data:`~pipeline.tools.report.data.SQL_VERDICTS` returns it (metrics as Nullable(Float64))."""
    m = {k: (float(v.metrics[k]) if isinstance(v.metrics.get(k), (int, float)) else None) for k in VERDICT_METRICS}
    return {"channel": v.channel, "route": v.route, "ts": datetime.fromtimestamp(v.ts_ms / 1000, tz=timezone.utc),
            "seq": v.seq, "state": v.state, "weight": v.weight, "reasons": list(v.reasons), **m}


def _report(verdicts: list[Verdict]) -> ReportData:
    rows = [_row(v) for v in sorted(verdicts, key=lambda v: (v.ts_ms, v.seq)) if v.channel == "drill/a"]
    return ReportData("channel drill/a", ["drill/a"], rows[0]["ts"] - timedelta(minutes=1),
                      rows[-1]["ts"] + timedelta(minutes=1), verdicts=rows)


def test_a_ten_minute_outage_shows_its_backed_off_cooldowns() -> None:
    """The engine on a 10 min outage (drill errors): opens at +2.5 s; at the round after its 90 s cooldown its
    own traffic (5 req/s of 503s) still fails, so it stays open without a half_open (SPEC §4.2 probe on
    evidence: a failed probe, cooldown 90 s x 2 + jitter), again (x 4 + jitter), then its probe after the
    outage passes. The table's cooldowns are the engine's: 90 s, backoff(1), backoff(2) seeded with the time
    of each round the traffic answered (PolicyConfig.backoff). Before probe on evidence the two middle
    rows were half_open probes that re-opened within the round ("re-opened")."""
    from pipeline.engine.replay import replay
    from pipeline.tools.drill.runner import plan_drill

    plan = plan_drill("errors", "drill/a", POLICY, duration_s=600, end_ms=END_MS, run_id="r")
    _, verdicts = replay(plan.events(), POLICY)
    got = probe_schedule(_report(verdicts))
    assert [(r.attempt, r.outcome) for r in got] == [(0, ANSWERED), (1, ANSWERED), (2, "recovering")]
    assert ANSWERED == "still failing (its traffic; no half_open)"
    assert [r.probed == got[k + 1].opened for k, r in enumerate(got[:2])] == [True, True]
    opened_ms = [int(r.opened.timestamp() * 1000) for r in got]
    want = [90.0] + [POLICY.backoff("").delay_ms(k, seed=t) / 1000 for k, t in ((1, opened_ms[1]), (2, opened_ms[2]))]
    assert [r.cooldown_s for r in got] == want
    assert 180 <= want[1] <= 198 and 360 <= want[2] <= 396
    for r in got:  # each probe in the first 30 s round at or after the cooldown's end
        assert r.next_probe is not None and r.probed is not None
        assert timedelta(0) <= r.probed - r.next_probe < timedelta(seconds=30)
    html = render_html(_report(verdicts), "test")
    assert '<table id="probes">' in html and "re-open 2" in html and f">{want[1]:.6g}<" in html
    assert schedule_text(POLICY) in html


def test_the_series_restarts_after_a_full_recovery() -> None:
    """A re-open counts within a series; healthy ends it, so the next open is a first cooldown again."""
    t0 = 1_750_032_000_000
    plan = [(0, "open", 90_000), (90_000, "half_open", None), (91_000, "open", 190_000),
            (300_000, "half_open", None), (390_000, "recovering", None), (1_200_000, "healthy", None),
            (2_000_000, "open", 90_000)]
    vs = [Verdict("drill/a", "drill", st, 0.0, ["error_rate"] if st == "open" else [],
                  {"next_probe_ts_ms": t0 + t + cool} if cool else {}, t0 + t, i)
          for i, (t, st, cool) in enumerate(plan)]
    got = probe_schedule(_report(vs))
    assert [(r.attempt, r.cooldown_s, r.outcome) for r in got] == [
        (0, 90.0, "re-opened"), (1, 190.0, "recovering"), (0, 90.0, "no probe in the window")]
    assert got[0].reasons == ("error_rate",)
