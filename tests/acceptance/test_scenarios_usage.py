"""Acceptance for SPEC §5.6 ``slow-failure`` and §5.7 ``quota-exhaustion`` (issue #18 item 6).

What holds with today's detectors is asserted now: the scenario's own
expectations that do not name a reason still to be built. The full
timelines (``slow_stream``, ``quota``) wait for those detectors: strict
xfail, so the day they pass the marker has to go.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.tools.simulate.scenarios_usage import PENDING_REASONS

from .test_scenarios import check_expected

PENDING = pytest.mark.xfail(strict=True, reason="detector lands with #18 quota/slow_stream/cost")


def _today(run):
    """``run`` with only the expectations that name no pending reason."""
    keep = tuple(e for e in run.scenario.expected if not set(e.get("reasons_any", ())) & set(PENDING_REASONS))
    assert len(keep) < len(run.scenario.expected)  # a pending one exists and was set aside
    return dataclasses.replace(run, scenario=dataclasses.replace(run.scenario, expected=keep))


def test_slow_failure_never_opens_and_heals(scenario_run):
    run = scenario_run("slow-failure")
    check_expected(_today(run))
    states = {v.state for v in run.of("fireworks/llama-70b@paid")}
    assert "open" not in states  # cancels are neutral and no upstream error happened


def test_quota_exhaustion_opens_at_the_429_wall(scenario_run):
    check_expected(_today(scenario_run("quota-exhaustion")))


@PENDING
@pytest.mark.parametrize("name", ["slow-failure", "quota-exhaustion"])
def test_full_timeline_with_the_pending_detectors(scenario_run, name):
    check_expected(scenario_run(name))


def _cost_creep():
    """clean-day's channels from 08:00: 2 h warm-up, then fireworks/llama-70b@paid's cost +30 % at once."""
    from pipeline.tools.simulate.faults import Fault
    from pipeline.tools.simulate.scenario import WARMUP_S

    from .conftest import scenario

    base = scenario("clean-day")
    ch = base.channels[0].name
    return dataclasses.replace(base, name="cost-creep", duration_s=WARMUP_S + 1800, start_hour=8.0,
                               faults=(Fault(ch, "cost_creep", WARMUP_S, WARMUP_S + 1800, {"factor": 1.3}),),
                               expected=()), ch, WARMUP_S


def test_cost_creep_reported_within_ten_minutes_with_state_and_weight_unchanged():
    """Issue #18: ``cost`` within 10 min of a +30 % step; advisory: healthy, full weight, others quiet."""
    from pipeline.engine_replay import replay

    from .conftest import START_MS

    sc, ch, t0 = _cost_creep()
    _, verdicts = replay(sc.events(start_ms=START_MS, seed=0))
    def t(v):
        return (v.ts_ms - START_MS) / 1000

    hits = sorted(t(v) for v in verdicts if v.channel == ch and "cost" in v.reasons)
    assert hits and t0 < hits[0] <= t0 + 600, hits[:3]
    assert not [v for v in verdicts if v.channel != ch and "cost" in v.reasons]
    assert not [v for v in verdicts if v.state != "healthy" and t(v) > 600]
    last = max((v for v in verdicts if v.channel == ch), key=lambda v: v.seq)
    assert last.reasons == ["cost"] and last.metrics["cost_ratio"] == pytest.approx(1.3, abs=0.05)
