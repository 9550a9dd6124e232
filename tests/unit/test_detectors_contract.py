"""Detector contract battery (every HARD/SOFT detector) and the specific SPEC §4 cases."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from scipy.stats import binomtest, norm

from pipeline.detectors import HARD_DETECTORS, SOFT_DETECTORS, ErrorRate, LatencyRatio, MissingFields
from pipeline.detectors.base import ThresholdArrays, safe_ratio, wilson_bounds, z_for
from pipeline.detectors.consecutive import ConsecutiveFailures
from pipeline.policy.defaults import FREE_TIER, PAID_TIER, Thresholds
from pipeline.windows.store import WindowView

ALL = HARD_DETECTORS + SOFT_DETECTORS
IDS = [d.reason for d in ALL]
VIEW_FIELDS = [f.name for f in dataclasses.fields(WindowView) if f.name != "now_ms"]


def view(c: int = 1, **fields) -> WindowView:
    """A WindowView of C channels: zeros / NaN P95s unless given (scalars broadcast)."""
    base = {f: np.zeros(c) for f in VIEW_FIELDS}
    base["p95_ms"] = np.full(c, np.nan)
    base["base_p95_ms"] = np.full(c, np.nan)
    for k, v in fields.items():
        base[k] = np.broadcast_to(np.asarray(v, dtype=np.float64), (c,)).copy()
    return WindowView(now_ms=1_000_000, **base)


def th(c: int = 1, tier: Thresholds = PAID_TIER) -> ThresholdArrays:
    return ThresholdArrays.build([tier] * c)


def busy_view(c: int) -> WindowView:
    """Plenty of clean traffic on every channel (nothing should fire)."""
    return view(c, judged_1m=600, judged_5m=3_000, ok_5m=3_000, checked_5m=3_000, p95_ms=200.0,
                n_latency_5m=3_000, base_p95_ms=200.0, base_n=50_000, base_hours=24)


def _check_shapes(f, c):
    assert f.fired.shape == (c,) and f.fired.dtype == bool
    assert f.metrics, "a finding carries its numbers"
    for k, v in f.metrics.items():
        assert isinstance(v, np.ndarray) and v.shape == (c,), k
        assert v.dtype == np.float64, k


# --- contract battery ----------------------------------------------------------

@pytest.mark.parametrize("det", ALL, ids=IDS)
@pytest.mark.parametrize("c", [0, 1, 5])
def test_empty_window_does_not_fire(det, c):
    f = det.detect(view(c), th(c), np.zeros(c, bool))
    _check_shapes(f, c)
    assert not f.fired.any()
    assert f.reason == det.reason


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_clean_busy_window_does_not_fire(det):
    f = det.detect(busy_view(4), th(4), np.zeros(4, bool))
    _check_shapes(f, 4)
    assert not f.fired.any()


THIN = {
    # below each detector's minimum sample, with values that would fire with enough data
    "consecutive_failures": dict(run=4),
    "error_rate": dict(judged_1m=29, failures_1m=29, judged_5m=29, failures_5m=29),
    "latency_p95_ratio": dict(p95_ms=1_000.0, n_latency_5m=49, base_p95_ms=100.0, base_n=10_000, base_hours=24),
    "missing_fields": dict(checked_5m=49, missing_5m=49),
    "quality": dict(quality_n_5m=19, quality_mean_5m=0.2, quality_var_5m=0.01, base_quality_n=10_000,
                    base_quality_mean=0.9, base_quality_var=0.01, base_quality_hours=24),
}
THIN_BASE = {
    "latency_p95_ratio": [dict(p95_ms=1_000.0, n_latency_5m=500, base_p95_ms=100.0, base_n=499, base_hours=24),
                          dict(p95_ms=1_000.0, n_latency_5m=500, base_p95_ms=100.0, base_n=10_000, base_hours=0)],
    "error_rate": [dict(judged_1m=1_000, failures_1m=7, judged_5m=1_000, failures_5m=7)],  # < 8 failures
    "quality": [dict(quality_n_5m=150, quality_mean_5m=0.2, quality_var_5m=0.01, base_quality_n=99,
                     base_quality_mean=0.9, base_quality_var=0.01, base_quality_hours=24),
                dict(quality_n_5m=150, quality_mean_5m=0.2, quality_var_5m=0.01, base_quality_n=10_000,
                     base_quality_mean=0.9, base_quality_var=0.01, base_quality_hours=0)],
}


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_thin_data_does_not_fire(det):
    cases = [THIN[det.reason]] + THIN_BASE.get(det.reason, [])
    for fields in cases:
        f = det.detect(view(3, **fields), th(3), np.zeros(3, bool))
        _check_shapes(f, 3)
        assert not f.fired.any(), fields


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_nan_inputs_do_not_fire_nor_raise(det):
    c = 3
    all_nan = view(c, **{f: np.nan for f in VIEW_FIELDS})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = det.detect(all_nan, th(c), np.zeros(c, bool))
    _check_shapes(f, c)
    assert not f.fired.any()
    # NaN in one channel does not disturb the others
    mixed = busy_view(c)
    mixed = dataclasses.replace(mixed, **{k: np.where(np.arange(c) == 1, np.nan, getattr(mixed, k))
                                          for k in VIEW_FIELDS})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = det.detect(mixed, th(c), np.zeros(c, bool))
    assert not f.fired.any()


@pytest.mark.parametrize("det", ALL, ids=IDS)
def test_fires_per_channel_only_where_evidence_is(det):
    """Channel 1 of 3 has firing evidence; 0 and 2 are clean."""
    firing = {
        "consecutive_failures": dict(run=5),
        "error_rate": dict(judged_1m=600, failures_1m=30, judged_5m=600, failures_5m=30),
        "latency_p95_ratio": dict(p95_ms=500.0, n_latency_5m=3_000),
        "missing_fields": dict(checked_5m=1_500, missing_5m=45),
        "quality": dict(quality_n_5m=150, quality_mean_5m=0.55, quality_var_5m=0.09, base_quality_n=10_000,
                        base_quality_mean=0.8, base_quality_var=0.06, base_quality_hours=24),
    }[det.reason]
    v = busy_view(3)
    v = dataclasses.replace(v, **{k: np.where(np.arange(3) == 1, val, getattr(v, k)) for k, val in firing.items()})
    f = det.detect(v, th(3), np.zeros(3, bool))
    _check_shapes(f, 3)
    assert f.fired.tolist() == [False, True, False]


def test_hard_and_soft_sets():
    assert [d.reason for d in HARD_DETECTORS] == ["consecutive_failures", "error_rate"]
    assert [d.reason for d in SOFT_DETECTORS] == ["latency_p95_ratio", "missing_fields", "quality"]


# --- consecutive failures ----------------------------------------------------------

@pytest.mark.parametrize("run,fired", [(0, False), (4, False), (5, True), (100, True)])
def test_consecutive_threshold(run, fired):
    f = ConsecutiveFailures().detect(view(1, run=run), th(1), np.zeros(1, bool))
    assert f.fired.tolist() == [fired]
    assert f.metrics["consecutive_failures"].tolist() == [float(run)]
    assert ConsecutiveFailures.trips(np.array([run]), np.array([5.0])).tolist() == [fired]


# --- error rate ----------------------------------------------------------------------

def _err(judged, failures, tier=PAID_TIER, window="both"):
    kw = {}
    if window in ("1m", "both"):
        kw.update(judged_1m=judged, failures_1m=failures)
    if window in ("5m", "both"):
        kw.update(judged_5m=judged, failures_5m=failures)
    return ErrorRate().detect(view(1, **kw), th(1, tier), np.zeros(1, bool))


def test_one_failure_in_twenty_does_not_trip_paid():
    assert not _err(20, 1).fired[0]
    # not even with the sample minimums lowered: the Wilson lower bound (0.31 %) is under 0.5 %
    loose = dataclasses.replace(PAID_TIER, error_min_requests=1, error_min_failures=1)
    assert not _err(20, 1, loose).fired[0]
    lo, _ = wilson_bounds(np.array([1.0]), np.array([20.0]), z_for(0.9999))
    assert 0.003 < lo[0] < 0.005


@pytest.mark.parametrize("window", ["1m", "5m", "both"])
def test_thirty_in_six_hundred_trips(window):
    f = _err(600, 30, window=window)
    assert f.fired[0]
    if window != "1m":
        assert f.metrics["error_rate_5m"][0] == pytest.approx(0.05)
        assert f.metrics["requests_5m"][0] == 600


def test_metrics_values():
    f = _err(600, 30)
    assert f.metrics["error_rate_1m"][0] == pytest.approx(0.05)
    assert f.metrics["error_rate_trip"][0] == 0.005
    lo, _ = wilson_bounds(np.array([30.0]), np.array([600.0]), z_for(0.9999))
    assert f.metrics["error_rate_lower_5m"][0] == pytest.approx(lo[0])


def test_free_line_is_lower_than_paid():
    assert PAID_TIER.error_rate_trip == 0.005 and FREE_TIER.error_rate_trip == 0.0035
    n, k = 100_000, 550  # 0.55 %: lower bound between 0.35 % and 0.5 %
    ci = binomtest(k, n).proportion_ci(confidence_level=1 - 2 * (1 - 0.9999), method="wilson")
    assert 0.0035 < ci.low < 0.005
    assert _err(n, k, FREE_TIER).fired[0]
    assert not _err(n, k, PAID_TIER).fired[0]
    # per-channel arrays: same counts, free and paid channels side by side
    both = ErrorRate().detect(view(2, judged_5m=n, failures_5m=k),
                              ThresholdArrays.build([FREE_TIER, PAID_TIER]), np.zeros(2, bool))
    assert both.fired.tolist() == [True, False]


def test_cancelled_not_counted():
    """judged excludes neutral outcomes at the store; 30 failures in 30 judged trips regardless of cancels."""
    assert _err(30, 30).fired[0]
    assert not _err(30, 0).fired[0]


@pytest.mark.parametrize("conf", [0.95, 0.99, 0.9999])
def test_wilson_matches_scipy(conf):
    z = z_for(conf)
    assert z == pytest.approx(norm.ppf(conf))
    rng = np.random.default_rng(int(conf * 1e4))
    ns = np.r_[1, 2, 5, 20, 30, 600, rng.integers(1, 100_000, 60)].astype(float)
    ks = np.array([rng.integers(0, n + 1) for n in ns.astype(int)], dtype=float)
    ks[:4] = [0, 2, 5, 1]
    lo, hi = wilson_bounds(ks, ns, z)
    for k, n, l, h in zip(ks, ns, lo, hi):
        ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=1 - 2 * (1 - conf), method="wilson")
        assert l == pytest.approx(ci.low, abs=1e-12, rel=1e-9)
        assert h == pytest.approx(ci.high, abs=1e-12, rel=1e-9)


def test_wilson_nan_for_empty_and_z_validation():
    lo, hi = wilson_bounds(np.array([0.0, 1.0]), np.array([0.0, 4.0]), 2.0)
    assert np.isnan(lo[0]) and np.isnan(hi[0]) and 0 < lo[1] < 0.25 < hi[1] < 1
    for bad in (0.5, 1.0, 0.2):
        with pytest.raises(ValueError):
            z_for(bad)
    assert safe_ratio(np.array([1.0, 1.0, 1.0]), np.array([0.0, np.nan, 4.0])).tolist()[2] == 0.25


# --- latency ratio ----------------------------------------------------------------------

def _lat(ratio, active, base=100.0, n=1_000, base_n=10_000, hours=24):
    v = view(1, p95_ms=ratio * base, n_latency_5m=n, base_p95_ms=base, base_n=base_n, base_hours=hours)
    return LatencyRatio().detect(v, th(1), np.array([active]))


def test_latency_hysteresis_sequence():
    active = False
    seq = []
    for r in (1.0, 1.79, 1.8, 1.5, 1.21, 1.2, 1.5, 1.79, 1.8):
        f = _lat(r, active)
        active = bool(f.fired[0])
        seq.append(active)
        assert f.metrics["latency_p95_ratio"][0] == pytest.approx(r)
    assert seq == [False, False, True, True, True, False, False, False, True]


def test_latency_thin_data_keeps_previous_finding():
    assert _lat(1.0, True, n=10).fired[0]  # no evidence: stays active
    assert not _lat(3.0, False, n=10).fired[0]
    assert not _lat(3.0, False, base_n=100).fired[0]
    assert not _lat(3.0, False, hours=0).fired[0]
    assert _lat(3.0, False, hours=1).fired[0]


def test_latency_metrics():
    f = _lat(2.0, False, base=150.0)
    assert f.metrics["p95_ms"][0] == 300.0 and f.metrics["baseline_p95_ms"][0] == 150.0
    assert f.metrics["latency_samples_5m"][0] == 1_000 and f.metrics["baseline_samples"][0] == 10_000


# --- missing fields ----------------------------------------------------------------------

def _miss(checked, missing, active):
    return MissingFields().detect(view(1, checked_5m=checked, missing_5m=missing), th(1), np.array([active]))


def test_missing_three_percent_of_1500_fires():
    f = _miss(1_500, 45, False)
    assert f.fired[0]
    assert f.metrics["missing_rate_5m"][0] == pytest.approx(0.03)
    assert f.metrics["checked_5m"][0] == 1_500


def test_missing_hysteresis():
    assert not _miss(1_500, 6, True).fired[0]  # 0.4 % <= 0.5 %: clears
    assert _miss(1_500, 12, True).fired[0]  # 0.8 %: stays
    assert not _miss(1_500, 12, False).fired[0]  # 0.8 % does not trip
    assert not _miss(1_500, 16, False).fired[0]  # 1.07 %: lower bound still under 1 %
    assert _miss(10, 0, True).fired[0]  # too few checked to clear


def test_missing_needs_min_checked():
    assert not _miss(49, 49, False).fired[0]
    assert _miss(50, 50, False).fired[0]
