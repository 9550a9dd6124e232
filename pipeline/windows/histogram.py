"""Log-bucketed latency histograms with a relative-error guarantee.

The bucket mapping is the one of DDSketch (Masson, Rim & Lee, "DDSketch: A
Fast and Fully-Mergeable Quantile Sketch with Relative-Error Guarantees",
VLDB 2019, §2): with ``gamma = (1 + alpha) / (1 - alpha)`` a value ``x`` goes
to key ``ceil(log_gamma(x))``; bucket ``k`` covers ``(gamma**(k-1), gamma**k]``
and is represented by ``2 * gamma**k / (gamma + 1)``, which is within a
relative ``alpha`` of every value in the bucket.

Guarantee (tested over seeded distributions in
``tests/unit/test_windows_histogram.py``): for latencies in
``[min_ms, max_ms]`` the quantile estimate ``q̂`` of rank
``floor(q * (n - 1))`` satisfies ``|q̂ - x_rank| <= alpha * x_rank``.
Values below ``min_ms`` share bucket 0 (absolute error < ``min_ms``); values
above ``max_ms`` share the top bucket (reported as ``max_ms``).

Confidence bounds for a quantile (:func:`order_statistic_rank`,
:meth:`LatencyBuckets.quantile_bound`) are the distribution-free order-statistic
bounds (David & Nagaraja, "Order Statistics", 3rd ed., §7.1; Hahn & Meeker,
"Statistical Intervals", §5.2): for ``n`` i.i.d. samples of a continuous
distribution, the number of samples below the ``q``-quantile is Binomial(n, q),
so the order statistic of a rank read off that binomial bounds the quantile
at a stated confidence, whatever the distribution.

Histograms here are plain ``numpy`` integer arrays whose last axis is the
bucket axis, so whole rings of them (channels × intervals × buckets) are
summed, merged and snapshotted with array operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import bdtr, bdtrik  # binomial CDF and its inverse in k (scipy.stats costs ~75 MB RSS)


@dataclass(frozen=True)
class LatencyBuckets:
    """Bucket mapping for latencies in milliseconds.

    ``alpha`` in (0, 0.5): relative accuracy (default 0.02 = 2 %, so a P95 of
    180 ms is reported within ±3.6 ms). ``min_ms`` > 0 and ``max_ms`` >
    ``min_ms`` bound the exactly-represented range (defaults 1 ms .. 10 min;
    SPEC §3 latencies above 10 min are timeouts in practice).

    >>> b = LatencyBuckets()
    >>> b.n_buckets
    334
    >>> round(float(b.value_of(b.key_of(np.array([180.0]))[0])), 1)
    177.8
    """

    alpha: float = 0.02
    min_ms: float = 1.0
    max_ms: float = 600_000.0

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if not 0.0 < self.min_ms < self.max_ms:
            raise ValueError(f"need 0 < min_ms < max_ms, got {self.min_ms}, {self.max_ms}")

    @property
    def gamma(self) -> float:
        """Bucket growth factor ``(1 + alpha) / (1 - alpha)``."""
        return (1.0 + self.alpha) / (1.0 - self.alpha)

    @property
    def n_buckets(self) -> int:
        """Number of buckets (key 0 holds everything <= ``min_ms``)."""
        return int(math.ceil(math.log(self.max_ms / self.min_ms) / math.log(self.gamma))) + 1

    def key_of(self, latency_ms: np.ndarray) -> np.ndarray:
        """Bucket keys (int32, shape of the input) for latencies in ms.

        NaN and negative inputs map to bucket 0; callers validate first.
        """
        x = np.asarray(latency_ms, dtype=np.float64) / self.min_ms
        k = np.ceil(np.log(np.maximum(x, 1.0)) / math.log(self.gamma))  # log of >= 1, inf or NaN: no warning
        # fmax maps NaN to 0, fmin caps +inf: the same keys as nan_to_num + clip, in two C calls
        return np.fmin(np.fmax(k, 0.0), self.n_buckets - 1).astype(np.int32)

    def value_of(self, key: np.ndarray | int) -> np.ndarray:
        """Representative latency (ms) of bucket ``key``: ``2 γ^k / (γ + 1)``."""
        k = np.asarray(key, dtype=np.float64)
        v = self.min_ms * 2.0 * np.power(self.gamma, k) / (self.gamma + 1.0)
        return np.minimum(v, self.max_ms)

    def quantile(self, counts: np.ndarray, q: float, min_count: int = 1) -> np.ndarray:
        """Quantile ``q`` in [0, 1] of histograms along the last axis.

        ``counts``: shape ``(..., n_buckets)`` of non-negative integers.
        Returns float64 of shape ``counts.shape[:-1]``; NaN where a histogram
        holds fewer than ``min_count`` (>= 1) values. Rank convention:
        the value of rank ``floor(q * (n - 1))`` (0-based) in sorted order,
        i.e. ``numpy.quantile(..., method="lower")``.

        Raises ``ValueError`` for ``q`` outside [0, 1].
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        counts = np.asarray(counts)
        total = counts.sum(axis=-1)
        cum = np.cumsum(counts, axis=-1)
        rank = np.floor(q * (total - 1)).astype(np.int64)
        key = np.argmax(cum > rank[..., None], axis=-1)
        out = self.value_of(key)
        return np.where(total >= max(1, min_count), out, np.nan)

    def quantile_bound(self, counts: np.ndarray, q: float, confidence: float, lower: bool = True,
                       min_count: int = 1) -> np.ndarray:
        """Distribution-free confidence bound (ms) of the ``q``-quantile of the values behind histograms.

        ``counts``: shape ``(..., n_buckets)``; returns float64 of shape
        ``counts.shape[:-1]``: with ``lower`` the lower edge of the bucket
        holding the order statistic of rank :func:`order_statistic_rank`
        (``P(bound <= true quantile) >= confidence``), else the upper edge
        (``P(bound >= true quantile) >= confidence``; ``inf`` in the top
        bucket). Bucket edges keep the guarantee exact despite the bucketing
        (a value's bucket lies between its edges). NaN where a histogram
        holds fewer than ``min_count`` values or too few for the confidence.
        Raises ``ValueError`` for ``q`` or ``confidence`` outside (0, 1).
        Generic: latency, TTFT, stream gaps, any histogram of this mapping.
        """
        counts = np.asarray(counts)
        total = counts.sum(axis=-1).astype(np.int64)
        rank = order_statistic_rank(total, q, confidence, lower)
        cum = np.cumsum(counts, axis=-1)
        key = np.argmax(cum > rank[..., None], axis=-1).astype(np.float64)
        if lower:
            edge = np.where(key > 0, self.min_ms * np.power(self.gamma, key - 1.0), 0.0)
        else:
            edge = np.where(key < self.n_buckets - 1, self.min_ms * np.power(self.gamma, key), np.inf)
        return np.where((total >= max(1, min_count)) & (rank >= 0), edge, np.nan)

    def count_above(self, counts: np.ndarray, value_ms: np.ndarray, ratio: float = 1.0) -> np.ndarray:
        """Values of histograms certainly above ``ratio`` × the upper edge of ``value_ms``'s bucket.

        ``counts``: shape ``(..., n_buckets)``; ``value_ms``: shape ``counts.shape[:-1]`` (NaN: no
        threshold, count 0); ``ratio`` >= 1. Counts the buckets whose lower edge is at or above
        ``ratio × γ^key(value_ms)``, so every counted value exceeds ``ratio × value_ms``'s bucket
        (bucket edges as in :meth:`quantile_bound`: the count never overstates). Returns float64 of
        shape ``counts.shape[:-1]``; O(n_buckets) per histogram. Raises ``ValueError`` for
        ``ratio < 1``.
        """
        if not ratio >= 1.0:
            raise ValueError(f"ratio must be >= 1, got {ratio}")
        counts = np.asarray(counts)
        value = np.asarray(value_ms, dtype=np.float64)
        first = self.key_of(np.nan_to_num(value, nan=self.max_ms)) + 1 + math.ceil(
            math.log(ratio) / math.log(self.gamma) - 1e-12)
        above = np.arange(counts.shape[-1]) >= first[..., None]
        return np.where(np.isfinite(value), np.where(above, counts, 0).sum(axis=-1), 0.0).astype(np.float64)


def order_statistic_rank(n: np.ndarray, q: float, confidence: float, lower: bool = True) -> np.ndarray:
    """0-based rank of the order statistic that bounds the ``q``-quantile at ``confidence``.

    ``n``: sample counts (array of non-negative integers); ``q`` in (0, 1);
    ``confidence`` in (0, 1). With ``X_(r)`` the r-th smallest (0-based) of
    ``n`` i.i.d. samples and ``B ~ Binomial(n, q)``:

    * ``lower=True``: the largest ``r`` with ``P(B >= r + 1) >= confidence``,
      so ``P(X_(r) <= x_q) >= confidence`` (David & Nagaraja §7.1);
    * ``lower=False``: the smallest ``r`` with ``P(B <= r) >= confidence``,
      so ``P(X_(r) >= x_q) >= confidence``.

    Returns int64 of ``n``'s shape; -1 where no rank reaches the confidence
    (too few samples: e.g. a 99 % lower bound of the P95 needs n >= 2, an
    upper one n >= 90). Raises ``ValueError`` for ``q`` or ``confidence``
    outside (0, 1).

    >>> order_statistic_rank(np.array([60, 1200, 10]), 0.95, 0.99).tolist()
    [52, 1121, 6]
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = np.asarray(n, dtype=np.int64)
    nf = np.maximum(n, 1).astype(np.float64)
    alpha = 1.0 - confidence if lower else confidence
    with np.errstate(invalid="ignore"):
        k = np.floor(np.nan_to_num(bdtrik(alpha, nf, q), nan=-1.0)).astype(np.int64)
    k = np.clip(k, -1, n)
    cdf = lambda r: np.where(r < 0, 0.0, np.where(r >= n, 1.0, bdtr(np.clip(r, 0, None), np.maximum(n, 1), q)))
    if lower:  # largest k with cdf(k) <= alpha (k = -1: none)
        for _ in range(3):
            k = np.where((k >= 0) & (cdf(k) > alpha), k - 1, k)
            k = np.where((k + 1 < n) & (cdf(k + 1) <= alpha), k + 1, k)
        return np.where((n > 0) & (k >= 0), k, -1)
    for _ in range(3):  # smallest k with cdf(k) >= confidence (k = n: none)
        k = np.where((k < n) & (cdf(k) < alpha), k + 1, k)
        k = np.where((k > 0) & (cdf(k - 1) >= alpha), k - 1, k)
    k = np.maximum(k, 0)
    return np.where((n > 0) & (k < n) & (cdf(k) >= alpha), k, -1)
