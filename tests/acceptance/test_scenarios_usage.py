"""Acceptance for SPEC §5.6 ``slow-failure`` and §5.7 ``quota-exhaustion`` (issue #18 items 2 and 6).

``slow-failure`` is asserted in full (the ``slow_stream`` signal exists).
For ``quota-exhaustion`` what holds with today's detectors is asserted now:
the scenario's own expectations that do not name a reason still to be built
(:data:`PENDING_REASONS`); its full timeline waits for the ``quota``
detector: strict xfail, so the day it passes the marker has to go.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.tools.simulate.scenario import WARMUP_S
from pipeline.tools.simulate.scenarios_usage import PENDING_REASONS

from .test_scenarios import check_expected

PENDING = pytest.mark.xfail(strict=True, reason="detector lands with #18 quota")
STALLED, CONTROL = "fireworks/llama-70b@paid", "deepinfra/llama-70b@free"


def _today(run):
    """``run`` with only the expectations that name no pending reason."""
    keep = tuple(e for e in run.scenario.expected if not set(e.get("reasons_any", ())) & set(PENDING_REASONS))
    assert len(keep) < len(run.scenario.expected)  # a pending one exists and was set aside
    return dataclasses.replace(run, scenario=dataclasses.replace(run.scenario, expected=keep))


def test_slow_failure_full_timeline(scenario_run):
    """Degraded with ``slow_stream`` within 2 min of the stalls starting (the scenario's expectation),
    never open, healthy again after; every other channel healthy throughout."""
    run = scenario_run("slow-failure")
    check_expected(run)
    first = next(v for v in run.of(STALLED) if "slow_stream" in v.reasons)
    assert (first.state, first.reasons) == ("degraded", ["slow_stream"])
    assert 0 < run.t(first.ts_ms) - WARMUP_S <= 120
    # no upstream error at all up to then: every status was ok or cancelled
    assert {e["status"] for e in run.events if e["channel"] == STALLED} == {"ok", "cancelled"}
    assert "open" not in {v.state for v in run.of(STALLED)}  # cancels are neutral: no error trip


def test_slow_failure_control_with_as_many_cancels_stays_healthy(scenario_run):
    """SPEC §4.6: client cancels without a stall are neutral."""
    run = scenario_run("slow-failure")

    def cancel_share(ch):
        ev = [e for e in run.events if e["channel"] == ch and WARMUP_S + 180 <= run.t(e["ts_ms"]) < WARMUP_S + 1020]
        return sum(e["status"] == "cancelled" for e in ev) / len(ev)

    assert cancel_share(CONTROL) == pytest.approx(cancel_share(STALLED), abs=0.05)  # ~30 % each
    vs = run.of(CONTROL)
    assert {v.state for v in vs} == {"healthy"}
    assert not any("slow_stream" in v.reasons for v in vs)
    assert max(v.metrics["stall_share_5m"] or 0.0 for v in vs) == 0.0


def test_quota_exhaustion_opens_at_the_429_wall(scenario_run):
    check_expected(_today(scenario_run("quota-exhaustion")))


@PENDING
def test_quota_exhaustion_full_timeline_with_the_pending_detector(scenario_run):
    check_expected(scenario_run("quota-exhaustion"))
