"""The Bernoulli CUSUM (pipeline.windows.cusum): its stated guarantees over seeded streams, and its windows.

Guarantees (module docstrings of pipeline.stats, pipeline.windows.cusum, pipeline.signals.error_rate / missing_fields):
* in control (rate = p0), at most 1 false alarm per 1000 channel-days (Siegmund's h less the overshoot
  correction); checked here as <= 3 alarms in 1000 simulated channel-days (default) or <= 12 in 10 000
  (slow), at 4 req/s, and by the exact ARL of the per-trial chart (Markov chain, Brook & Evans 1972) >= the
  stated one for p0 from 5e-5 to 3 %;
* error creep 0 -> 5 % over 20 min at 4 req/s: median alarm <= 255 s after the start (rate ~1 %);
* 3 % hollow answers at 4 req/s: median alarm <= 60 s, 95 % of the streams within 120 s.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.signals.error_rate import ERROR_CUSUM, error_windows
from pipeline.signals.missing_fields import MISSING_CUSUM
from pipeline.stats import DAY_S, CusumDesign, design_h, kl_bernoulli, llr_weights, threshold_h
from pipeline.windows.extension import WindowSpec
from pipeline.windows.features import EventColumns

SLOT_S = 10.0


def _chart(design: CusumDesign, p0_true: float, rate_rps: float, p_of_t, n_slots: int, streams: int,
           seed: int) -> np.ndarray:
    """Alarm time (s, inf: none) of ``streams`` charts on Poisson(rate * 10 s) trials per slot with
    Binomial(n, p_of_t(t)) events, designed from a learned rate of ``p0_true`` (the windows' rule)."""
    rng = np.random.default_rng(seed)
    p0, p1 = design.rates(np.array(1e9), np.array(1e9 * p0_true))
    h = float(design_h(design, np.array(rate_rps), p0, p1))
    a, b = (float(x) for x in llr_weights(p0, p1))
    s = np.zeros(streams)
    alarm = np.full(streams, np.inf)
    for j in range(n_slots):
        n = rng.poisson(rate_rps * SLOT_S, streams)
        k = rng.binomial(n, p_of_t((j + 0.5) * SLOT_S))
        s = np.minimum(np.maximum(s + k * a + (n - k) * b, 0.0), 2.0 * h)
        hit = (s >= h) & np.isinf(alarm)
        alarm[hit] = (j + 1) * SLOT_S
    return alarm


def test_threshold_solves_siegmund():
    p0, p1, arl = np.array([0.0001, 0.003]), np.array([0.0046, 0.0075]), np.array([3e8, 1e7])
    h = threshold_h(arl, p0, p1)
    np.testing.assert_allclose((np.exp(h) - h - 1) / kl_bernoulli(p0, p1), arl, rtol=1e-6)


def test_design_rates_follow_the_channel_and_the_floor():
    p0, p1 = ERROR_CUSUM.rates(np.array([0.0, 1e6, 1e6]), np.array([0.0, 0.0, 3000.0]))
    assert p0[0] == pytest.approx(0.005)  # no history: the prior
    assert p0[1] == 0.00005 and p1[1] == pytest.approx(0.00455)  # clean: the floor, + 0.45 %
    assert p0[2] == pytest.approx(0.003, rel=0.01) and p1[2] == pytest.approx(0.0075, rel=0.01)
    with pytest.raises(ValueError, match="shift"):
        CusumDesign(p_floor=0.001, shift=0.0)
    with pytest.raises(ValueError, match="arl0_days"):
        CusumDesign(p_floor=0.001, shift=0.01, arl0_days=0)


@pytest.mark.parametrize("p0_true", [0.0001, 0.003])
def test_in_control_false_alarms_per_channel_day(p0_true):
    days, streams = 1, 1000  # 1000 channel-days at 4 req/s
    alarm = _chart(ERROR_CUSUM, p0_true, 4.0, lambda t: p0_true, int(days * DAY_S / SLOT_S), streams, seed=1)
    assert np.isfinite(alarm).sum() <= 3


@pytest.mark.slow
@pytest.mark.parametrize("design,p0_true", [(ERROR_CUSUM, 0.0001), (ERROR_CUSUM, 0.003), (MISSING_CUSUM, 0.001)])
def test_in_control_false_alarms_per_channel_day_long(design, p0_true):
    days, streams = 10, 1000  # 10 000 channel-days: ARL0 1000 days -> ~10 expected at most
    alarm = _chart(design, p0_true, 4.0, lambda t: p0_true, int(days * DAY_S / SLOT_S), streams, seed=2)
    assert np.isfinite(alarm).sum() <= 12


def _exact_arl_trials(p0: float, a: float, b: float, h: float) -> float:
    """In-control ARL (trials) of the per-trial chart from 0: a Markov chain on the lattice of the non-event
    step ``b`` (< 0), the event step ``a`` rounded to whole lattice steps (Brook & Evans 1972)."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as sla

    m, n = int(round(a / -b)), int(np.ceil(h / -b))
    i = np.arange(n)
    up = i + m < n
    rows = np.r_[i, i, i[up]]
    cols = np.r_[i, np.maximum(i - 1, 0), (i + m)[up]]
    vals = np.r_[np.ones(n), np.full(n, -(1.0 - p0)), np.full(up.sum(), -p0)]
    return float(sla.spsolve(sp.csc_matrix((vals, (rows, cols)), shape=(n, n)), np.ones(n))[0])


@pytest.mark.parametrize("design", [ERROR_CUSUM, MISSING_CUSUM])
def test_exact_in_control_arl_meets_the_stated_one(design):
    for p0_true in (0.00005, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03):
        if p0_true < design.p_floor:
            continue
        p0, p1 = design.rates(np.array(1e9), np.array(1e9 * p0_true))
        h = float(design_h(design, np.array(4.0), p0, p1))
        a, b = (float(x) for x in llr_weights(p0, p1))
        assert _exact_arl_trials(float(p0), a, b, h) >= design.arl0_days * DAY_S * 4.0


def test_error_creep_detected_within_four_minutes():
    alarm = _chart(ERROR_CUSUM, 0.0, 4.0, lambda t: 0.05 * min(t / 1200.0, 1.0), 90, 400, seed=3)
    assert np.isfinite(alarm).all()
    assert np.median(alarm) <= 255.0
    assert 0.05 * np.median(alarm) / 1200 <= 0.011  # the injected rate at the median alarm


def test_hollow_three_percent_detected_within_ninety_seconds():
    alarm = _chart(MISSING_CUSUM, 0.0, 4.0, lambda t: 0.03, 30, 400, seed=4)
    assert np.median(alarm) <= 60.0
    assert np.percentile(alarm, 95) <= 120.0


def _cols(channel, ts_ms, failed):
    n = len(ts_ms)
    return EventColumns(channel=np.asarray(channel, np.int64), ts_ms=np.asarray(ts_ms, np.int64),
                        outcome=np.asarray(failed, np.int8), ok=~np.asarray(failed, bool),
                        latency_ms=np.ones(n), checked=np.zeros(n, bool), missing=np.zeros(n, bool),
                        rate_limited=np.zeros(n, bool))


def test_windows_fold_each_complete_slot_once_and_match_the_recursion():
    """Two channels, 3 min of traffic fed in two batches; the chart equals Page's recursion on the
    10 s counts, a second view at the same time changes nothing, a state entry restarts it at 0."""
    w = error_windows(WindowSpec())
    w.ensure_capacity(2)
    rng = np.random.default_rng(5)
    t0 = 1_750_000_000_000 - 1_750_000_000_000 % 3_600_000
    ts = np.sort(rng.integers(t0, t0 + 180_000, 1_000))
    ch = rng.integers(0, 2, ts.size)
    failed = (rng.random(ts.size) < np.where(ch == 1, 0.2, 0.0)).astype(np.int8)
    w.add(_cols(ch[:500], ts[:500], failed[:500]), np.zeros(500, bool))
    w.add(_cols(ch[500:], ts[500:], failed[500:]), np.zeros(500, bool))
    now = t0 + 120_000
    got = w.features(np.array([0, 1]), now, None)
    p0, p1 = ERROR_CUSUM.rates(np.zeros(2), np.zeros(2))  # nothing learned before the first fold
    a, b = llr_weights(p0, p1)
    h = design_h(ERROR_CUSUM, np.array(0.0), p0, p1)
    for c in (0, 1):
        s = 0.0
        for slot in range(12):  # the ring keeps the last 12 slots: 0..11 before now
            m = (ch == c) & (ts >= t0 + slot * 10_000) & (ts < t0 + (slot + 1) * 10_000)
            n, k = m.sum(), failed[m].sum()
            s = min(max(s + k * a[c] + (n - k) * b[c], 0.0), 2 * h[c])
        assert got["error_cusum"][c] == pytest.approx(s)
    assert got["error_cusum"][1] >= got["error_cusum_h"][1] > 0 and got["error_cusum"][0] == 0.0
    again = w.features(np.array([0, 1]), now, None)
    for k in got:
        np.testing.assert_array_equal(again[k], got[k])
    since = np.array([np.iinfo(np.int64).min // 2, now], np.int64)
    reset = w.features(np.array([0, 1]), now + 30_000, since)
    assert reset["error_cusum"][1] < got["error_cusum"][1]
    back = error_windows(WindowSpec())
    back.ensure_capacity(2)
    for i in (0, 1):
        back.import_row(i, w.export_row(i))
    np.testing.assert_array_equal(back.state[:2], w.state[:2])
    with pytest.raises(ValueError, match="state"):
        back.import_row(0, {**w.export_row(0), "state": np.zeros(5)})
