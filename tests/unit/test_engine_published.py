"""``published_values`` (a round's metric array as published numbers) equals the per-value rule it replaced.

The reference is the implementation before the fast path (commit 11a95bd): ``round(v, 4)`` for every
finite value, None for NaN and infinities. The fast path skips ``round`` for integral floats and rounds a
repeated value once; the published values must be the same objects' values bit for bit (sign of zero
included) on seeded arrays mixing counts, thresholds, fractions, huge and tiny values and non-finite ones.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.engine.published import published_values


def reference(values) -> list:
    a = np.asarray(values)
    return [round(v, 4) if math.isfinite(v) else None for v in a.astype(np.float64).tolist()]


def _key(values: list) -> list:
    return [None if v is None else (type(v).__name__, v.hex()) for v in values]


def _mixed(rng: np.random.Generator, n: int) -> np.ndarray:
    kinds = rng.integers(0, 8, n)
    out = np.empty(n)
    out[kinds == 0] = rng.integers(0, 5000, int((kinds == 0).sum()))  # counts
    out[kinds == 1] = np.nan
    out[kinds == 2] = rng.random(int((kinds == 2).sum()))  # shares
    out[kinds == 3] = rng.normal(0, 1e6, int((kinds == 3).sum()))  # large fractions
    out[kinds == 4] = rng.choice([np.inf, -np.inf, -0.0, 0.0, 0.5, 0.00005, 0.00015, 2.5e-5, -1.23456789])
    k5 = int((kinds == 5).sum())
    out[kinds == 5] = rng.normal(0, 1, k5) * 10.0 ** rng.integers(-12, 300, k5)
    out[kinds == 6] = np.round(rng.normal(0, 1e17, int((kinds == 6).sum())))  # integral beyond 2**53
    out[kinds == 7] = rng.integers(-10**6, 10**6, int((kinds == 7).sum())) / 10_000  # 4 places already
    return out


@pytest.mark.parametrize("seed", range(20))
def test_published_equals_reference_on_mixed_arrays(seed):
    rng = np.random.default_rng(seed)
    a = _mixed(rng, int(rng.choice([0, 1, 7, 1000])))
    assert _key(published_values(a)) == _key(reference(a))


@pytest.mark.parametrize("values", [
    np.full(1000, 0.05), np.full(3, 2.0 / 3.0), np.full(5, np.nan), np.zeros(4), np.array([-0.0, 0.0, -0.0]),
    np.arange(10, dtype=np.int64), np.array([True, False]), np.full(6, 0.12345, np.float32), np.array([], float),
    np.array([1e300, -1e300, 2.0 ** 60 + 0.0, 123456789.00005]),
])
def test_published_equals_reference_on_special_arrays(values):
    assert _key(published_values(values)) == _key(reference(values))
