"""The exact (Clopper-Pearson) rate bounds of the fast paths and their guarantee at the trip line.

Guarantees (module docstrings of pipeline.stats / pipeline.signals.error_rate / missing_fields / slow_stream / quota):
* ``exact_lower`` / ``exact_upper`` equal scipy's Beta quantiles (Clopper & Pearson 1934);
* a window whose true rate is exactly at the trip line trips with probability <= alpha = 1 - confidence at
  every count: 1e-6 for ``error_rate`` (paid 0.5 %, free 0.35 %), 1e-4 for ``missing_fields`` (1 %) and the
  stall share (2 %). Checked two ways: the exact binomial sum over the counts the detector fires on, for
  every window size from 30 to 3000, and seeded Binomial draws at a level where trips are observable;
* the Wilson bound it replaced did not hold this: P(trip) at n = 700, p = 0.35 % was 2.3e-4 (the slow-failure
  scorecard's false verdict, seed 18).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import beta, binom

from pipeline.signals import ErrorRate, MissingFields
from pipeline.stats import exact_lower, exact_upper, wilson_bounds, z_for
from pipeline.policy.defaults import FREE_TIER, PAID_TIER
from tests.unit.test_detectors_contract import th, view

SIZES = np.r_[30:200, 200:3001:7]
#: The paid tier with the count minimums at 1, so that only the bound decides.
LOOSE = dataclasses.replace(PAID_TIER, error_min_requests=1, error_min_failures=1)


def test_exact_bounds_match_scipy_beta():
    rng = np.random.default_rng(7)
    n = rng.integers(1, 50_000, 200).astype(float)
    k = np.floor(rng.random(200) * (n + 1))
    k[:3], n[:3] = [0, 5, 7], [10, 5, 691]
    for alpha in (1e-6, 1e-4, 0.01):
        lo, hi = exact_lower(k, n, alpha), exact_upper(k, n, alpha)
        want_lo = np.where(k > 0, beta.ppf(alpha, k, n - k + 1), 0.0)
        want_hi = np.where(k < n, beta.ppf(1 - alpha, k + 1, n - k), 1.0)
        np.testing.assert_allclose(lo, want_lo, rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(hi, want_hi, rtol=1e-9, atol=1e-15)


def test_exact_bounds_nan_outside_the_mask_and_for_empty_windows():
    lo = exact_lower(np.array([3.0, 3.0, 0.0, 0.0]), np.array([100.0, 100.0, 50.0, 0.0]), 0.01,
                     np.array([True, False, True, True]))
    assert lo[0] == pytest.approx(beta.ppf(0.01, 3, 98)) and np.isnan(lo[1]) and lo[2] == 0.0 and np.isnan(lo[3])
    for bad in (0.0, 0.5, -1.0):
        with pytest.raises(ValueError, match="alpha"):
            exact_lower(np.array([1.0]), np.array([2.0]), bad)


def _trip_probability(detect_fired, n: int, line: float) -> float:
    """Exact P(trip) of a window of ``n`` trials at true rate ``line``: the binomial mass of the counts that fire."""
    k = np.arange(n + 1, dtype=float)
    return float(binom.pmf(k, n, line)[detect_fired(k, np.full(n + 1, float(n)))].sum())


@pytest.mark.parametrize("tier,line", [(PAID_TIER, 0.005), (FREE_TIER, 0.0035)])
def test_error_rate_fast_path_at_the_line_trips_at_most_one_in_a_million(tier, line):
    det = ErrorRate()
    worst = max(_trip_probability(
        lambda k, n: det.detect(view(len(k), judged_5m=n, failures_5m=k), th(len(k), tier),
                                np.zeros(len(k), bool)).fired, int(n), line) for n in SIZES)
    assert worst <= 1e-6
    # the Wilson bound at the same level: 10 failures in 700 trip it, 2.3e-4 of the windows at the line
    lo, _ = wilson_bounds(np.array([10.0]), np.array([700.0]), z_for(0.999999))
    assert lo[0] > 0.0035 and binom.sf(9, 700, 0.0035) == pytest.approx(2.3e-4, rel=0.05)


def test_missing_fields_window_at_the_line_trips_at_most_one_in_ten_thousand():
    det = MissingFields()
    worst = max(_trip_probability(
        lambda k, n: det.detect(view(len(k), checked_5m=n, missing_5m=k), th(len(k)), np.zeros(len(k), bool)).fired,
        int(n), 0.01) for n in SIZES[SIZES >= 50])
    assert worst <= 1e-4


def test_stall_share_bound_at_the_line_misses_at_most_one_in_ten_thousand():
    worst = 0.0
    for n in SIZES:
        k = np.arange(n + 1, dtype=float)
        fires = (k >= 5) & (np.nan_to_num(exact_lower(k, np.full(n + 1, float(n)), 1e-4)) > 0.02)
        worst = max(worst, float(binom.pmf(k, n, 0.02)[fires].sum()))
    assert worst <= 1e-4


def test_seeded_windows_at_the_line_trip_at_most_at_the_stated_level():
    """200 000 seeded windows per size at the paid line, the detector at 99 %: trip rate <= 1 % (+ 3 sigma)."""
    det = ErrorRate(confidence=0.99)
    rng = np.random.default_rng(19)
    for n in (30, 100, 300, 700, 2000):
        k = rng.binomial(n, 0.005, 200_000).astype(float)
        fired = det.detect(view(len(k), judged_5m=float(n), failures_5m=k), th(len(k), LOOSE),
                           np.zeros(len(k), bool)).fired
        assert fired.mean() <= 0.01 + 3 * np.sqrt(0.01 * 0.99 / len(k))


def test_quota_rising_share_bounds_hold_their_level():
    """A steady 429 share: the 5 min lower bound exceeds the true share on <= 1 % of seeded windows."""
    rng = np.random.default_rng(23)
    for n in (20, 60, 300):
        k = rng.binomial(n, 0.1, 100_000).astype(float)
        ns = np.full(len(k), float(n))
        assert (exact_lower(k, ns, 0.01) > 0.1).mean() <= 0.01 + 3 * np.sqrt(0.01 * 0.99 / len(k))
        assert (exact_upper(k, ns, 0.01) < 0.1).mean() <= 0.01 + 3 * np.sqrt(0.01 * 0.99 / len(k))


def test_slow_failure_seed_18_clean_free_channel_stays_closed():
    """The scorecard's false verdict (slow-failure, seed 18): the clean 0.2 % free control channel opened on
    ``error_rate`` at t = 1890 s on 10 failures in ~691 requests (Wilson bound 0.36 % > 0.35 %)."""
    from pipeline.engine.replay import replay
    from pipeline.policy.defaults import PolicyConfig
    from pipeline.tools.scorecard.runner import START_MS
    from pipeline.tools.simulate.scenarios import get_scenario

    events = list(get_scenario("slow-failure").events(start_ms=START_MS, seed=18))
    _, verdicts = replay(events, policy=PolicyConfig())
    states = {v.state for v in verdicts if v.channel == "deepinfra/llama-70b@free"
              and v.ts_ms - START_MS < 7_200_000}
    assert states == {"healthy"}
