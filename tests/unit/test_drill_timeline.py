"""pipeline.tools.drill: kinds, the policy-derived expected timeline, its comparison, in-process drills."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.contracts import Verdict
from pipeline.policy.defaults import PolicyConfig
from pipeline.tools.drill.kinds import DRILL_WARMUP_S, KINDS, drill_fault, get_kind
from pipeline.tools.drill.runner import plan_drill, run_in_process
from pipeline.tools.drill.timeline import (Transition, compare, expected_steps, format_rows, latest_recovery_ms,
                                           on_grid, published_ramp, ramp_weights, share_detection_ms, transitions)

POLICY = PolicyConfig()
T0 = 1_750_032_000_000


def test_kinds_cover_the_issue_and_unknown_kinds_are_listed():
    assert set(KINDS) == {"errors", "latency", "hollow", "stream_stall", "quota_drain", "quality_drift"}
    with pytest.raises(ValueError, match="unknown drill kind 'smoke'; valid: errors, latency, hollow"):
        get_kind("smoke")
    f = drill_fault(KINDS["latency"], "drill/a", 3900, 600)
    assert (f.kind, f.start_s, f.end_s, f.params["factor"]) == ("latency_ramp", 3900, 4500, 3.0)


def test_ramp_weights_follow_spec_section_4():
    assert ramp_weights(POLICY) == [0.1, 0.2, 0.3, 0.4, 0.6, 0.8]


def test_errors_timeline_is_cooldown_observation_and_ramp_steps():
    steps = expected_steps(KINDS["errors"], POLICY, 60_000)
    assert [s.label for s in steps] == ["open", "half_open", "recovering 0.10", "recovering 0.20",
                                        "recovering 0.30", "recovering 0.40", "recovering 0.60",
                                        "recovering 0.80", "healthy"]
    assert [s.delay_ms for s in steps] == [30_000, 90_000, 90_000] + [120_000] * 6
    assert steps[0].bound and not steps[1].bound
    assert {s.tolerance_ms for s in steps} == {30_000}


def test_a_fault_longer_than_the_cooldown_expects_failed_probes_then_recovery():
    steps = expected_steps(KINDS["errors"], POLICY, 150_000)
    assert steps[1].label == "half_open" and steps[1].cycle
    actual = [Transition(T0 + 1_000, "open", 0.0, ("consecutive_failures",)),
              Transition(T0 + 91_000, "half_open", 0.05, ()),
              Transition(T0 + 91_500, "open", 0.0, ("consecutive_failures",)),  # probe into the fault
              Transition(T0 + 200_000, "half_open", 0.05, ()),  # fault ended at 150 s
              Transition(T0 + 290_000, "recovering", 0.1, ())]
    rows = compare(steps[:3], actual, T0, T0 + 150_000)
    assert [(r.transition, r.status, r.diff_ms) for r in rows] == [
        ("open", "ok", -29_000), ("half_open", "ok", 0), ("open (probe, fault on)", "ok", 500),
        ("half_open", "ok", 18_500), ("recovering 0.10", "ok", 0)]


def test_alone_on_its_route_the_ramp_under_the_panic_line_is_published_at_the_floor():
    """SPEC §4.2 (issue #33): the drill's channel is alone on route ``drill``; ramp weights 0.1-0.3 are under
    the panic line (w / 0.7 < 0.5) and are published at route_panic_weight 0.5 with ``route_panic``, one
    transition for the three steps; 0.4 (0.57 of full) is not. With siblings the plain ramp is expected."""
    assert published_ramp(POLICY, "drill") == [(0.5, True)] * 3 + [(0.4, False), (0.6, False), (0.8, False)]
    assert published_ramp(POLICY) == [(w, False) for w in ramp_weights(POLICY)]
    steps = expected_steps(KINDS["errors"], POLICY, 60_000, "drill")
    assert [s.label for s in steps] == ["open", "half_open", "recovering 0.50", "recovering 0.40",
                                        "recovering 0.60", "recovering 0.80", "healthy"]
    assert steps[2].reason == "route_panic" and steps[3].reason is None
    assert [s.delay_ms for s in steps] == [30_000, 90_000, 90_000, 360_000, 120_000, 120_000, 120_000]
    off = dataclasses.replace(POLICY, route_panic_threshold=0.0)
    assert [s.label for s in expected_steps(KINDS["errors"], off, 60_000, "drill")] == [
        s.label for s in expected_steps(KINDS["errors"], POLICY, 60_000)]


def test_a_half_open_is_due_at_the_backed_off_cooldown_its_open_published():
    """Issue #33 part 3: the re-open after a failed probe waits 90 s x 2 (+ jitter), not 90 s; the drill
    takes the cooldown the open's verdict published (next_probe_ts_ms), so a half_open 191 s after the
    re-open is on time and one 90 s after it is early."""
    steps = expected_steps(KINDS["errors"], POLICY, 150_000)
    reopen_ms = T0 + 91_500
    nxt = reopen_ms + POLICY.backoff("").delay_ms(1, seed=reopen_ms)
    assert 180_000 <= nxt - reopen_ms <= 198_000
    for half_open_ms, status in ((-(-nxt // 30_000) * 30_000, "ok"), (reopen_ms + 90_000, "early")):
        actual = [Transition(T0 + 1_000, "open", 0.0, ("consecutive_failures",), T0 + 91_000),
                  Transition(T0 + 91_000, "half_open", 0.05, ()),
                  Transition(reopen_ms, "open", 0.0, ("consecutive_failures",), nxt),
                  Transition(half_open_ms, "half_open", 0.05, ())]
        rows = compare(steps[:2], actual, T0, T0 + 150_000)
        assert [(r.transition, r.status) for r in rows] == [
            ("open", "ok"), ("half_open", "ok"), ("open (probe, fault on)", "ok"), ("half_open", status)]
        # due in the first round (30 s grid of event time) at or after the published cooldown end: the
        # on-time half_open is exact (diff 0), the early one is 115.7 s before that round
        assert rows[-1].diff_ms == half_open_ms - -(-nxt // 30_000) * 30_000
        assert rows[-1].diff_ms == (0 if status == "ok" else -(T0 + 300_000 - reopen_ms - 90_000))


def test_a_half_open_is_due_in_the_round_after_its_cooldown_ends():
    """Rounds run at event-time multiples of eval_interval_ms (30 s): an open pre-tripped at +2.5 s publishes
    its probe at +92.5 s, and the half_open comes in the round at +120 s. The drill expects +120 s (diff 0);
    a half_open at +92.5 s (no round there) is 27.5 s early."""
    assert on_grid(92_500, 30_000) == 120_000 and on_grid(120_000, 30_000) == 120_000 and on_grid(7, 0) == 7
    steps = expected_steps(KINDS["errors"], POLICY, 60_000)
    assert steps[1].grid_ms == POLICY.eval_interval_ms
    for half_open_ms, diff in ((120_000, 0), (92_500, -27_500)):
        actual = [Transition(T0 + 2_500, "open", 0.0, ("consecutive_failures",), T0 + 92_500),
                  Transition(T0 + half_open_ms, "half_open", 0.05, ())]
        rows = compare(steps[:2], actual, T0, T0 + 60_000)
        assert (rows[1].expected_ms, rows[1].diff_ms) == (120_000, diff)


def test_an_open_whose_traffic_answers_its_probe_is_due_when_the_half_open_would_have_been():
    """SPEC §4.2 probe on evidence: at the cooldown's end the channel stays open with a later
    next_probe_ts_ms (no half_open). transitions() lists that open (an open repeating the same probe time is
    no transition), and compare() expects it in the round the half_open was due, then the half_open again
    at the new cooldown's end."""
    steps = expected_steps(KINDS["errors"], POLICY, 300_000)
    first, second = T0 + 92_500, T0 + 120_000 + 190_000

    def open_at(t_ms: int, probe_ms: int, seq: int) -> Verdict:
        return Verdict("drill/a", "drill", "open", 0.0, ["consecutive_failures"], {"next_probe_ts_ms": probe_ms},
                       t_ms, seq)
    for answered_ms, status in ((T0 + 120_000, "ok"), (T0 + 180_000, "late")):
        vs = [open_at(T0 + 2_500, first, 1), open_at(T0 + 90_000, first, 2), open_at(answered_ms, second, 3),
              open_at(answered_ms + 30_000, second, 4),
              Verdict("drill/a", "drill", "half_open", 0.05, [], {}, T0 + 330_000, 5)]
        actual = transitions(vs, "drill/a")
        assert [(tr.ts_ms - T0, tr.state, tr.next_probe_ms) for tr in actual] == [
            (2_500, "open", first), (answered_ms - T0, "open", second), (330_000, "half_open", None)]
        rows = compare(steps[:2], actual, T0, T0 + 300_000)
        assert [(r.transition, r.expected_ms, r.status) for r in rows] == [
            ("open", 30_000, "ok"), ("open (probe answered by its traffic, fault on)", 120_000, status),
            ("half_open", 330_000, "ok")]


def test_a_long_fault_plans_room_for_the_backed_off_probes():
    """Issue #33 part 3: a 30 min outage re-opens after each failed probe and waits 90, 180, 360, 720, 900 s
    (x up to 1.1 jitter, capped at 15 min). At their longest, each to the next 30 s round, + a round for
    each failed probe's re-open: open <= +60 s (bound + tolerance), half_open +150, open +180, half_open
    +390 (198 s), open +420, +840 (396 s), +870, +1,680 (792 s), +1,710, +2,610 (900 s: after the fault's
    end), then the recovery 90 + 6 x 120 s and 30 s tolerance: 3,450 s. The old plan (one fault length
    beyond the 90 s timeline: 2,790 s) ends before healthy (measured in process: healthy at +3,187 s)."""
    assert latest_recovery_ms(KINDS["errors"], POLICY, 1_800_000) == 3_450_000
    assert latest_recovery_ms(KINDS["errors"], POLICY, 60_000) == 990_000  # no re-open: 60 + 90 + 810 + 30
    assert latest_recovery_ms(KINDS["latency"], POLICY, 600_000) == 0
    plan = plan_drill("errors", "drill/a", POLICY, duration_s=1800, end_ms=T0, run_id="r")
    assert plan.end_ms - plan.fault_start_ms == 3_450_000 + 300_000  # + TAIL_S
    result = run_in_process(plan, POLICY)
    assert result.passed, result.table()
    # SPEC §4.2 probe on evidence: the drill channel's own 503s answer each probe while the fault runs, so it
    # stays open at each cooldown's end (no half_open; before: a half_open and a re-open within the round)
    labels = [r.transition for r in result.rows]
    assert labels.count("open (probe answered by its traffic, fault on)") == 4 and "open (probe, fault on)" not in labels
    assert result.rows[-1].transition == "healthy" and all(r.diff_ms == 0 for r in result.rows[1:]
                                                           if not r.bound), result.table()


def test_a_stricter_policy_changes_the_expectation():
    strict = dataclasses.replace(POLICY, open_cooldown_ms=60_000, ramp_interval_ms=60_000)
    steps = expected_steps(KINDS["errors"], strict, 30_000)
    assert [s.delay_ms for s in steps[1:4]] == [60_000, 90_000, 60_000]


def test_share_detection_bound_from_the_exact_test():
    # 8 % missing at 3 checks/s against the 1 % line: the Clopper-Pearson lower bound (one-sided 99.99 %, as the
    # detector) of the expected count over a 5 min window (900 checks) first exceeds 1 % 109 s after the fault
    # starts (30 s ramp: k = 0.08 x 3 x 94 = 22.56 of 900, bound 1.005 %; at 108 s 22.32, bound 0.989 %)
    assert share_detection_ms(0.08, 0.01, 3.0, POLICY) == 109_000
    with pytest.raises(ValueError, match="can never trip"):
        share_detection_ms(0.005, 0.01, 3.0, POLICY)


def _v(ts: int, state: str, weight: float, reasons=(), seq=0) -> Verdict:
    return Verdict("drill/a", "drill", state, weight, list(reasons), {}, ts, seq)


def test_transitions_keep_state_changes_and_ramp_steps_only():
    vs = [_v(T0, "healthy", 1.0, seq=1), _v(T0 + 30_000, "open", 0.0, ["error_rate"], 2),
          _v(T0 + 60_000, "open", 0.0, seq=3), _v(T0 + 90_000, "recovering", 0.1, seq=4),
          _v(T0 + 120_000, "recovering", 0.1, seq=5), _v(T0 + 150_000, "recovering", 0.2, seq=6)]
    got = transitions(vs, "drill/a")
    assert [(t.ts_ms - T0, t.state, t.weight) for t in got] == [(30_000, "open", 0.0), (90_000, "recovering", 0.1),
                                                                (150_000, "recovering", 0.2)]


def test_compare_reports_on_time_late_missing_and_unexpected():
    steps = expected_steps(KINDS["errors"], POLICY, 60_000)[:3]
    actual = [Transition(T0 + 1_000, "open", 0.0, ("consecutive_failures",)),
              Transition(T0 + 150_000, "half_open", 0.05, ()),  # 59 s after open + 90 s: late
              Transition(T0 + 160_000, "degraded", 0.85, ("latency_p95_ratio",))]
    rows = compare(steps, actual, T0, T0 + 60_000)
    assert [(r.transition, r.status, r.diff_ms) for r in rows] == [
        ("open", "ok", -29_000), ("half_open", "late", 59_000), ("recovering 0.10", "not detected", None),
        ("degraded (latency_p95_ratio)", "unexpected", None)]
    assert rows[2].expected_ms == 240_000  # anchored on the actual half_open
    table = format_rows(rows)
    assert "half_open" in table and "+59.0 s" in table and "<= 30.0 s" in table


def test_a_missing_detector_is_said_not_faked():
    # every drill kind's detector exists today: a kind declared without one says so instead of failing
    kind = dataclasses.replace(KINDS["quota_drain"], detector_missing=True)
    rows = compare(expected_steps(kind, POLICY, 1_800_000), [], T0, T0 + 1_800_000, kind)
    assert rows[0].transition == "degraded (quota)" and rows[0].status == "detector missing"
    for name in ("stream_stall", "quota_drain"):  # their detectors exist: an unmatched step is a miss
        real = KINDS[name]
        rows = compare(expected_steps(real, POLICY, 1_800_000), [], T0, T0 + 1_800_000, real)
        assert rows[0].status == "not detected", name


def test_plan_places_the_fault_after_the_warm_up_and_ends_at_end_ms():
    plan = plan_drill("errors", "drill/a", POLICY, end_ms=T0, run_id="r1")
    assert plan.fault_start_ms - plan.start_ms == DRILL_WARMUP_S * 1000
    assert plan.fault_end_ms - plan.fault_start_ms == 60_000 and plan.end_ms == T0
    # last step (healthy) due 30 + 90 + 90 + 6 x 120 s = 930 s after the fault start, + 30 s tolerance
    # + 60 s (probe cycles may push it back by the fault's length) + 300 s tail
    assert plan.end_ms - plan.fault_start_ms == 1_320_000
    with pytest.raises(ValueError, match="--duration must be > 0"):
        plan_drill("errors", "drill/a", POLICY, duration_s=0)


@pytest.mark.parametrize("kind", ["errors", "latency", "hollow"])
def test_in_process_drill_matches_its_timeline(kind):
    plan = plan_drill(kind, f"drill/{kind}", POLICY, end_ms=T0, run_id="r")
    result = run_in_process(plan, POLICY)
    assert result.passed, result.table()
    if kind == "errors":  # SPEC §4 recovery: every step within one evaluation round of its due time
        assert [r.transition for r in result.rows][-1] == "healthy"
        assert all(abs(r.diff_ms) <= 30_000 for r in result.rows[1:])


def test_in_process_stream_stall_drill_finds_slow_stream_within_2_min():
    plan = plan_drill("stream_stall", "drill/stall", POLICY, end_ms=T0, run_id="r")
    result = run_in_process(plan, POLICY)
    assert result.passed, result.table()
    assert [r.transition for r in result.rows] == ["degraded (slow_stream)", "healthy"]
    assert result.rows[0].expected_ms == 120_000 and 0 < result.rows[0].actual_ms <= 120_000


def test_in_process_quota_drill_degrades_on_quota_opens_cycles_while_refused_then_recovers():
    plan = plan_drill("quota_drain", "drill/quota", POLICY, end_ms=T0, run_id="r")
    result = run_in_process(plan, POLICY)
    rows = result.rows
    assert rows[0].transition == "degraded (quota)" and rows[0].status == "ok"
    assert rows[0].actual_ms == 330_000  # 5.5 min into the drain, 14.5 min before the 429 wall (measured)
    labels = [r.transition for r in rows]
    assert labels[1] == "open" and "open (probe, fault on)" in labels and labels[-1] == "healthy"
    assert all(r.status == "ok" for r in rows), format_rows(rows)
    assert result.passed


def test_a_live_drill_expects_the_floor_only_when_its_channel_is_alone_on_its_route():
    """A live drill runs on the channel's real route: alone there, its recovery is published under the SPEC §4.2
    panic floor as on the shadow route "drill"; beside siblings, the plain ramp (they hold the route's weight)."""
    floored = ["open", "half_open", "recovering 0.50", "recovering 0.40", "recovering 0.60", "recovering 0.80",
               "healthy"]
    plain = ["open", "half_open", "recovering 0.10", "recovering 0.20", "recovering 0.30", "recovering 0.40",
             "recovering 0.60", "recovering 0.80", "healthy"]
    for route, alone, want in (("drill", None, floored), ("chat-70b", None, plain), ("chat-70b", True, floored),
                               ("drill", False, plain)):
        plan = plan_drill("errors", "drill/a", POLICY, end_ms=T0, run_id="r", route=route, alone=alone)
        assert [s.label for s in plan.steps] == want, (route, alone)
    # the route's own panic threshold decides: 0 turns the floor off on that route
    off = dataclasses.replace(POLICY, route_panic_thresholds={"chat-70b": 0.0})
    plan = plan_drill("errors", "drill/a", off, end_ms=T0, run_id="r", route="chat-70b", alone=True)
    assert [s.label for s in plan.steps] == plain
