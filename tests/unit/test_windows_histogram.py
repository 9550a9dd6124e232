"""pipeline.windows.histogram: DDSketch-style buckets, quantiles within alpha."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.windows.histogram import LatencyBuckets

ALPHA = 0.02
TOL = ALPHA * (1 + 1e-9)
QS = (0.5, 0.95, 0.99)
LO_MS, HI_MS = 1.0, 300_000.0  # 1 ms .. 5 min


def _clip(x: np.ndarray) -> np.ndarray:
    return np.clip(x, LO_MS, HI_MS)


def _lognormal(rng, n, sigma):
    return _clip(rng.lognormal(mean=math.log(200.0), sigma=sigma, size=n))


def _exponential(rng, n, scale):
    return _clip(rng.exponential(scale, size=n) + LO_MS)


def _bimodal(rng, n, fast, slow, p_slow):
    slow_mask = rng.random(n) < p_slow
    x = np.where(slow_mask, rng.lognormal(math.log(slow), 0.3, n), rng.lognormal(math.log(fast), 0.2, n))
    return _clip(x)


def _uniform_log(rng, n):
    return np.exp(rng.uniform(math.log(LO_MS), math.log(HI_MS), n))


DISTRIBUTIONS = (
    [("lognormal", sigma, seed, lambda r, n, s=sigma: _lognormal(r, n, s))
     for sigma in (0.1, 0.5, 1.0, 2.0) for seed in (1, 2, 3)]
    + [("exponential", scale, seed, lambda r, n, s=scale: _exponential(r, n, s))
       for scale in (5.0, 300.0, 20_000.0) for seed in (4, 5)]
    + [("bimodal", p, seed, lambda r, n, p=p: _bimodal(r, n, 80.0, 9_000.0, p))
       for p in (0.02, 0.06, 0.3, 0.5) for seed in (6, 7)]
    + [("bimodal-extreme", 0.1, 8, lambda r, n: _bimodal(r, n, 2.0, 250_000.0, 0.1))]
    + [("log-uniform", 0, seed, lambda r, n: _uniform_log(r, n)) for seed in (9, 10)]
)


def _hist(b: LatencyBuckets, x: np.ndarray) -> np.ndarray:
    return np.bincount(b.key_of(x), minlength=b.n_buckets).astype(np.int64)


@pytest.mark.parametrize("name,param,seed,draw", DISTRIBUTIONS,
                         ids=[f"{d[0]}-{d[1]}-{d[2]}" for d in DISTRIBUTIONS])
@pytest.mark.parametrize("n", [1, 7, 100, 5_000])
def test_quantile_within_alpha_of_numpy_lower(name, param, seed, draw, n):
    b = LatencyBuckets()
    rng = np.random.default_rng(seed * 1000 + n)
    x = draw(rng, n)
    h = _hist(b, x)
    for q in QS:
        exact = float(np.quantile(x, q, method="lower"))
        est = float(b.quantile(h, q))
        assert abs(est - exact) <= TOL * exact, (name, param, n, q, est, exact)


def test_every_value_in_range_is_represented_within_alpha():
    b = LatencyBuckets()
    x = np.exp(np.linspace(math.log(1.0), math.log(600_000.0), 200_001))
    rep = b.value_of(b.key_of(x))
    assert np.all(np.abs(rep - x) <= TOL * x)


def test_batched_histograms_along_last_axis():
    b = LatencyBuckets()
    rng = np.random.default_rng(42)
    samples = [_lognormal(rng, n, s) for n, s in ((400, 0.3), (900, 1.2), (50, 0.8))]
    stack = np.stack([_hist(b, x) for x in samples]).reshape(3, 1, b.n_buckets)
    est = b.quantile(stack, 0.95)
    assert est.shape == (3, 1)
    for i, x in enumerate(samples):
        exact = np.quantile(x, 0.95, method="lower")
        assert abs(est[i, 0] - exact) <= TOL * exact


def test_defaults_and_bucket_count():
    b = LatencyBuckets()
    assert b.alpha == 0.02 and b.min_ms == 1.0 and b.max_ms == 600_000.0
    assert b.gamma == pytest.approx(1.02 / 0.98)
    assert b.n_buckets == math.ceil(math.log(600_000.0) / math.log(1.02 / 0.98)) + 1 == 334


def test_out_of_range_values():
    b = LatencyBuckets()
    keys = b.key_of(np.array([0.0, 0.5, 1.0, 1e9, np.nan, -3.0]))
    assert keys.dtype == np.int32
    assert keys.tolist() == [0, 0, 0, b.n_buckets - 1, 0, 0]
    # Values above max_ms share the top bucket, reported within alpha of max_ms.
    top = float(b.value_of(b.n_buckets - 1))
    assert top <= 600_000.0 and abs(top - 600_000.0) <= TOL * 600_000.0
    # Below min_ms: absolute error < min_ms.
    assert abs(float(b.value_of(0)) - 0.3) < 1.0


@pytest.mark.parametrize("min_count,n,expect_nan", [(1, 0, True), (1, 1, False), (10, 9, True),
                                                    (10, 10, False), (50, 49, True), (0, 0, True)])
def test_nan_below_min_count(min_count, n, expect_nan):
    b = LatencyBuckets()
    h = _hist(b, np.full(n, 123.0))
    for q in QS:
        v = float(b.quantile(h, q, min_count=min_count))
        assert math.isnan(v) == expect_nan
        if not expect_nan:
            assert abs(v - 123.0) <= TOL * 123.0


def test_nan_per_row_in_batch():
    b = LatencyBuckets()
    h = np.stack([_hist(b, np.full(5, 100.0)), _hist(b, np.full(60, 100.0)), np.zeros(b.n_buckets, np.int64)])
    out = b.quantile(h, 0.95, min_count=50)
    assert math.isnan(out[0]) and not math.isnan(out[1]) and math.isnan(out[2])


@pytest.mark.parametrize("q", [-0.01, 1.01, -1.0, 2.0, float("nan"), float("inf")])
def test_q_out_of_range_raises(q):
    b = LatencyBuckets()
    with pytest.raises(ValueError):
        b.quantile(np.ones(b.n_buckets), q)


@pytest.mark.parametrize("q", [0.0, 1.0])
def test_q_edges_are_min_and_max(q):
    b = LatencyBuckets()
    x = np.array([3.0, 50.0, 700.0, 12_000.0])
    exact = x.min() if q == 0.0 else x.max()
    assert abs(float(b.quantile(_hist(b, x), q)) - exact) <= TOL * exact


@pytest.mark.parametrize("kwargs", [dict(alpha=0.0), dict(alpha=0.5), dict(alpha=-0.1),
                                    dict(min_ms=0.0), dict(min_ms=10.0, max_ms=10.0), dict(min_ms=-1.0)])
def test_invalid_construction(kwargs):
    with pytest.raises(ValueError):
        LatencyBuckets(**kwargs)


def test_other_alpha_keeps_its_guarantee():
    b = LatencyBuckets(alpha=0.005, min_ms=0.5, max_ms=1_000_000.0)
    rng = np.random.default_rng(11)
    x = np.clip(rng.lognormal(math.log(40.0), 1.5, 20_000), 0.5, 1_000_000.0)
    h = np.bincount(b.key_of(x), minlength=b.n_buckets)
    for q in QS:
        exact = float(np.quantile(x, q, method="lower"))
        assert abs(float(b.quantile(h, q)) - exact) <= 0.005 * (1 + 1e-9) * exact
