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
