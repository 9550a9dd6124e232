"""Building blocks of the simulator: day/night curve, channel profiles, latency model, faults."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.tools.simulate.channels import BASE_ERROR_RATE, ChannelProfile, LatencyModel, RouteSpec
from pipeline.tools.simulate.faults import FAULT_KINDS, Fault, channel_effects, failure_probability, overload_factors
from pipeline.tools.simulate.load import DiurnalCurve
from pipeline.tools.simulate.traces import load_llmperf


def test_diurnal_curve_trough_peak_and_latency_swing():
    c = DiurnalCurve(start_hour=0.0, night_fraction=0.35, latency_swing=0.15)
    assert float(c.load_factor(4 * 3600)) == pytest.approx(0.35)
    assert float(c.load_factor(16 * 3600)) == pytest.approx(1.0)
    assert float(c.load_factor(10 * 3600)) == pytest.approx(0.675)
    assert float(c.latency_multiplier(4 * 3600)) == pytest.approx(0.85)
    assert float(c.latency_multiplier(16 * 3600)) == pytest.approx(1.15)
    assert float(c.latency_multiplier(10 * 3600)) == pytest.approx(1.0)
    assert c.mean_load_factor == pytest.approx(0.675)
    shifted = DiurnalCurve(start_hour=8.0)
    assert float(shifted.load_factor(2 * 3600)) == pytest.approx(0.675)  # 10:00
    with pytest.raises(ValueError, match="start_hour"):
        DiurnalCurve(start_hour=24.0)


def test_channel_profile_defaults_and_validation():
    free = ChannelProfile("lepton/llama-70b@free", "chat-70b", "free")
    paid = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid")
    assert free.base_error_rate == 0.002 == BASE_ERROR_RATE["free"]
    assert paid.base_error_rate == 0.003
    assert free.base_error_rate < paid.base_error_rate  # SPEC §4.1
    assert sum(paid.base_failure_mix.values()) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="suffix"):
        ChannelProfile("lepton/llama-70b@free", "chat-70b", "paid")
    with pytest.raises(ValueError, match="structured_share"):
        ChannelProfile("a/b@free", "r", "free", structured_share=1.5)
    with pytest.raises(ValueError, match="unknown failure status"):
        ChannelProfile("a/b@free", "r", "free", failure_mix={"cancelled": 1.0})
    route = RouteSpec("chat-70b", 10.0, {free.name: 3.0, paid.name: 1.0})
    assert route.static_share(free.name) == 0.75
    with pytest.raises(ValueError, match="shares sum to 0"):
        RouteSpec("r", 1.0, {"a": 0.0})


def test_latency_model_scales_to_the_chosen_quantile():
    trace = load_llmperf("together_70b")  # ../shared/data or the shipped samples (every request of the file)
    m = LatencyModel.from_llmperf(trace, 180.0, 0.95)
    assert m.p95_ms == pytest.approx(180.0)
    med = LatencyModel.from_llmperf(trace, 2200.0, 0.5)
    assert med.quantile(0.5) == pytest.approx(2200.0)
    lat, ttft, gap = m.sample(np.random.default_rng(0), 200_000)
    assert np.quantile(lat, 0.95) == pytest.approx(180.0, rel=0.01)
    assert np.all(ttft <= lat) and np.all(gap >= 0) and np.all(gap <= lat - ttft + 1e-9)


def test_fault_validation_lists_valid_kinds():
    with pytest.raises(ValueError) as err:
        Fault("a", "meltdown", 7200, 7300)
    for kind in FAULT_KINDS:
        assert kind in str(err.value)
    with pytest.raises(ValueError, match="start_s < end_s"):
        Fault("a", "outage", 7300, 7200)
    with pytest.raises(ValueError, match="last failure"):
        Fault("a", "consecutive_failures", 0, 100, {"count": 7, "gap_s": 75})
    with pytest.raises(ValueError, match="to_rate"):
        Fault("a", "error_ramp", 0, 100, {"to_rate": 2.0})
    with pytest.raises(ValueError, match="curve must be >= 1"):
        Fault("a", "error_ramp", 0, 100, {"to_rate": 0.05, "curve": 0.5})


def test_error_ramp_curve_accelerates_failures_late():
    ch = ChannelProfile("lepton/llama-70b@free", "chat-70b", "free")
    fault = Fault(ch.name, "error_ramp", 100, 1000, {"to_rate": 0.046, "ramp_s": 600, "curve": 2.0})
    t = np.array([100.0, 250.0, 400.0, 700.0, 999.0])
    p = failure_probability(ch, channel_effects(ch, (fault,), t), np.zeros(len(t)))
    # 0.2 % + 4.4 % x progress^2: a quarter of the way, 1/16 of the extra failures
    np.testing.assert_allclose(p, [0.002, 0.002 + 0.044 / 16, 0.002 + 0.044 / 4, 0.046, 0.046])


def test_ramped_faults_and_outage_effects():
    ch = ChannelProfile("lepton/llama-70b@free", "chat-70b", "free")
    faults = (
        Fault(ch.name, "latency_ramp", 100, 1000, {"factor": 4.0, "ramp_s": 600}),
        Fault(ch.name, "error_ramp", 100, 1000, {"to_rate": 0.046, "ramp_s": 600}),
        Fault(ch.name, "missing_fields", 100, 1000, {"to_rate": 0.04, "ramp_s": 400}),
        Fault(ch.name, "outage", 2000, 2100),
        Fault("other", "outage", 0, 5000),
    )
    channel, kind, start_s, end_s, params = faults[0]
    assert (channel, kind, start_s, end_s, params["ramp_s"]) == (ch.name, "latency_ramp", 100, 1000, 600)
    t = np.array([50.0, 100.0, 400.0, 700.0, 999.0, 1000.0, 2050.0])
    eff = channel_effects(ch, faults, t)
    np.testing.assert_allclose(eff.latency_factor, [1, 1, 2.5, 4, 4, 1, 1])
    p = failure_probability(ch, eff, np.zeros(len(t)))
    np.testing.assert_allclose(p, [0.002, 0.002, 0.024, 0.046, 0.046, 0.002, 1.0])
    np.testing.assert_allclose(eff.missing_rate, [0, 0, 0.03, 0.04, 0.04, 0, 0])


def test_overload_factors_above_capacity_only():
    ch = ChannelProfile("t/b@paid", "r", "paid", capacity_rps=10.0, overload_latency_gain=2.0, overload_error_gain=0.06)
    eff = channel_effects(ch, (), np.zeros(3))
    lat, err = overload_factors(eff, np.array([5.0, 10.0, 15.0]))
    np.testing.assert_allclose(lat, [1.0, 1.0, 2.0])
    np.testing.assert_allclose(err, [0.0, 0.0, 0.03])
    unlimited = channel_effects(ChannelProfile("t/c@paid", "r", "paid"), (), np.zeros(1))
    lat, err = overload_factors(unlimited, 1e6)
    assert lat[0] == 1.0 and err[0] == 0.0
    window = (Fault("t/c@paid", "overload", 10, 20, {"capacity_rps": 5.0, "latency_gain": 1.0}),)
    eff = channel_effects(ChannelProfile("t/c@paid", "r", "paid"), window, np.array([5.0, 15.0]))
    lat, _ = overload_factors(eff, 10.0)
    np.testing.assert_allclose(lat, [1.0, 2.0])
