"""pipeline.policy.reasons: a verdict lists every active finding, hard ones first."""

from __future__ import annotations

from pipeline.policy.reasons import published_reasons


def test_open_channel_keeps_its_trip_reason_and_adds_the_active_findings():
    got = published_reasons("open", ["consecutive_failures"], ["error_rate"], ["quality", "latency_p95_ratio"])
    assert got == ["consecutive_failures", "error_rate", "latency_p95_ratio", "quality"]


def test_no_duplicates_and_hard_before_soft():
    got = published_reasons("open", ["error_rate"], ["error_rate"], ["missing_fields"])
    assert got == ["error_rate", "missing_fields"]


def test_degraded_channel_lists_its_soft_reasons_in_detector_order():
    assert published_reasons("degraded", ["missing_fields"], [], ["latency_p95_ratio", "missing_fields"]) == [
        "latency_p95_ratio", "missing_fields"]


def test_degraded_channel_whose_finding_cleared_keeps_the_held_reason_while_its_weight_recovers():
    assert published_reasons("degraded", ["latency_p95_ratio"], [], []) == ["latency_p95_ratio"]


def test_no_data_leaves_stale_soft_findings_out():
    assert published_reasons("no_data", ["no_data"], [], ["latency_p95_ratio"]) == ["no_data"]


def test_healthy_without_findings_has_no_reasons():
    assert published_reasons("healthy", [], [], []) == []


def test_unregistered_soft_reason_is_published_last_without_raising():
    """An engine built with a signal outside the registry (tests, a trial) may fire a soft code SOFT_ORDER lacks."""
    assert published_reasons("degraded", ["quality"], [], ["zz_trial", "latency_p95_ratio", "quality"]) == [
        "latency_p95_ratio", "quality", "zz_trial"]
