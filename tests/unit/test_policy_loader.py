"""pipeline.policy.defaults.load_policy: flat keys and per-signal tables, clear errors."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.signals import SIGNALS
from pipeline.policy.defaults import FREE_TIER, PAID_TIER, PARAM_SIGNAL, Thresholds, load_policy


def _load(tmp_path, text: str):
    p = tmp_path / "policy.toml"
    p.write_text(text)
    return load_policy(p)


def test_signal_tables_and_flat_keys(tmp_path):
    pol = _load(tmp_path, """
[policy]
eval_interval_ms = 15000
[tier.free]
consecutive_failures = 4
[tier.free.latency_p95_ratio]
latency_ratio_trip = 2.5
[channel."x@paid".error_rate]
error_rate_trip = 0.01
[channel."y@free"]
tier = "free"
[channel."y@free".quality]
quality_min_drop = 0.2
""")
    assert pol.eval_interval_ms == 15000
    free = pol.thresholds("any", "free")
    assert (free.consecutive_failures, free.latency_ratio_trip, free.error_rate_trip) == (4, 2.5, 0.0035)
    assert free.signal("latency_p95_ratio").latency_ratio_trip == 2.5
    x = pol.thresholds("x@paid", "paid")
    assert x.error_rate_trip == 0.01 and x.consecutive_failures == 5  # the paid tier's other values
    y = pol.thresholds("y@free", None)
    assert y.quality_min_drop == 0.2 and y.consecutive_failures == 4 and y.latency_ratio_trip == 2.5
    assert pol.thresholds("z", None) == PAID_TIER


@pytest.mark.parametrize("text,message", [
    ("[tier.free]\nerror_rate_trp = 0.1", r"\[tier.free\]: unknown keys \['error_rate_trp'\]"),
    ("[tier.free.error_rat]\nerror_rate_trip = 0.1", r"unknown signal table \[error_rat\]"),
    ("[tier.free.error_rate]\nlatency_ratio_trip = 2.0", r"\[tier.free\].error_rate: unknown keys \['latency_ratio_trip'\]"),
    ("[tier.free]\nerror_rate_trip = 0.1\n[tier.free.error_rate]\nerror_rate_trip = 0.2", "error_rate_trip is given twice"),
    ("[tier.free.error_rate]\nerror_rate_trip = 2.0", r"\[tier.free\]: error_rate_trip must be in \(0, 1\), got 2.0"),
    ('[channel."c".consecutive_failures]\nconsecutive_failures = 101', "consecutive_failures must be in 1..100"),
    ("[policy]\nnope = 1", r"\[policy\]: unknown keys \['nope'\]"),
])
def test_bad_policy_names_the_table_and_key(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, text)


def test_thresholds_are_the_registry_params():
    for s in SIGNALS:
        for f in dataclasses.fields(s.params):
            assert PARAM_SIGNAL[f.name] == s.name
            assert getattr(PAID_TIER, f.name) == f.default
    assert PARAM_SIGNAL["half_open_max_error_rate"] is None
    assert FREE_TIER == dataclasses.replace(PAID_TIER, error_rate_trip=0.0035)
    with pytest.raises(dataclasses.FrozenInstanceError):
        PAID_TIER.error_rate_trip = 0.1  # type: ignore[misc]
    with pytest.raises(ValueError, match="half_open_max_error_rate"):
        Thresholds(half_open_max_error_rate=0.0)
