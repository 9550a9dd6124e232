"""SPEC §4.3 P95 latency over 5 min vs the rolling 24 h baseline P95.

ratio = P95(ok requests, last 5 min) / P95(ok requests, 24 complete hours
before the current hour). Trips on a lower confidence bound, clears on the
point estimate (hysteresis, so a ratio hovering around one line does not
flap):

* trip: a distribution-free lower confidence bound of the P95 (the
  order statistic whose rank comes from Binomial(n, 0.95); David & Nagaraja,
  "Order Statistics", §7.1; :meth:`LatencyBuckets.quantile_bound`) is at or
  above ``latency_ratio_trip`` (1.8) × baseline, over the last 5 min (99 %) or
  over the last 30 s (95 %) (the round just ended: a P95 ×2 swap at 4 req/s is seen in
  one round), each with ``latency_min_requests`` samples. A few outliers in
  a thin window cannot lift the bound: with 60 samples it is the 8th
  largest, so two ~100 s answers among them do not trip (issue #19);
* trip in one round on a shift: the point P95 of the last 30 s slot (at
  least ``latency_min_requests`` samples) at or above 1.8 × baseline *and*
  evidence that the whole distribution moved, not its top few answers. The
  evidence is an exact one-sided binomial test (Conover, "Practical
  Nonparametric Statistics", 3rd ed., §3.1) on ``k`` = the slot's samples
  above 1.2 × the baseline P95 (:meth:`LatencyBuckets.count_above`).
  H0: the slot is stochastically at most 1.2 × the baseline (the clear line:
  a channel inside it is not degraded, day/night swings included); under H0
  each sample exceeds the line with probability at most the baseline's share
  above its own P95, ``p0``, taken at its ``1 - SHIFT_BASE_BETA`` upper
  bound (that share is Beta(n - r, r + 1) for the order statistic of rank
  r; David & Nagaraja §2.2). Trip when P(Binomial(n, p0) >= k) <=
  ``SHIFT_ALPHA``. Guarantee (union bound, i.i.d. samples): a clean channel
  trips on this path with probability <= SHIFT_ALPHA + SHIFT_BASE_BETA =
  2e-7 per round, i.e. <= 5.8e-4 false alarms per channel-day of 2,880
  rounds (<= 1 per 1,700; issue #19 target: 1 per 1,000). A thin window's
  outliers fail the evidence (two ~100 s answers are k = 2 of 60). Delay of a
  P95 ×2 swap at 4 req/s (120 samples a slot; checked over seeded streams
  in ``tests/unit/test_latency_shift.py``): the first round for >= 99 % of
  the swaps of lognormal sigma 0.15 and of the llmperf latency shapes; for
  sigma 0.5 the 30 s point P95 reaches 1.8x in ~84 % of the rounds and the
  test ~85 %, so ~75 % in the first round and >= 97 % within three;
* clear: the 5 min point estimate at or below ``latency_ratio_clear`` (1.2)
  × baseline.

Needs ``baseline_min_requests`` samples in the baseline and
``baseline_min_hours`` hours of history; without enough evidence the
previous finding is kept (no evidence either way). Metrics beside the ratios:
``latency_p95_30s_ratio`` (the last slot's point ratio) and
``latency_shift_p`` (the shift test's p-value; NaN unless that ratio is at
or above the trip line, so a quiet round costs no scipy call).

Windows (:class:`LatencyWindows`): per channel a ring of 10 × 30 s latency
histograms of ``ok`` requests (the 5 min window and its last 30 s slot) and
one of 25 × 1 h (the 24 complete hours of the baseline plus the hour being
filled), in the DDSketch buckets of :class:`LatencyBuckets` (334 buckets of
2 %). Memory per busy channel: (10 + 25) × 334 × 4 bytes ≈ 46 KB; a slot
never written costs no resident memory (:mod:`pipeline.windows.ring`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from scipy.special import bdtrc, betaincinv

from pipeline.signals.base import Examples, Finding, Order, Params, Signal, ThresholdArrays, param
from pipeline.stats import safe_ratio
from pipeline.windows.extension import RingWindows, WindowSpec, row_selector
from pipeline.windows.features import EventColumns
from pipeline.windows.histogram import LatencyBuckets
from pipeline.windows.ring import IntervalRing
from pipeline.windows.view import WindowView

#: Level of the one-round shift test per round and channel (see the module docstring).
SHIFT_ALPHA = 1e-7
#: One-sided miss probability of the upper bound of the baseline's share above its P95.
SHIFT_BASE_BETA = 1e-7
#: The 10 s grid of the store's counters, on which the windows' ends are computed (``since`` rounded up to it).
SHORT_SLOT_MS = 10_000
#: Slot of the short latency histograms: 30 s, the round interval (SPEC §4), so a round's 5 min
#: window is the same whole slots as with 10 s ones at a third of the memory.
LAT_SLOT_MS = 30_000
#: Slot of the baseline histograms: 1 h (SPEC §4.3: 24 complete hours).
BASE_SLOT_MS = 3_600_000
#: One-sided confidence of the P95 lower bounds in the view (issue #19: a handful of outliers in a thin
#: window cannot lift the bound; :meth:`LatencyBuckets.quantile_bound`).
P95_BOUND_CONFIDENCE = 0.99
#: The same for the last 30 s slot alone: 95 %, so a P95 x2 swap at 4 req/s (120 samples) is certified in
#: the round it happens; a clean channel still needs ~10 of 120 answers above 1.8x its P95 to trip.
P95_BOUND_CONFIDENCE_30S = 0.95
#: Null scale of the 30 s shift evidence: SPEC §4.3's clear ratio (``latency_ratio_clear``).
SHIFT_NULL_RATIO = 1.2


def baseline_tail_share(base_n: np.ndarray, beta: float = SHIFT_BASE_BETA) -> np.ndarray:
    """Upper ``1 - beta`` bound of the population share above a baseline's P95 estimate.

    ``base_n``: baseline sample counts, shape (C,), float or int (< 2: NaN);
    ``beta`` in (0, 1). The P95 is the order statistic of 0-based rank
    ``r = floor(0.95 (n - 1))`` (:meth:`LatencyBuckets.quantile`), whose
    exceedance share is Beta(n - r, r + 1) for continuous i.i.d. samples
    (David & Nagaraja, "Order Statistics", 3rd ed., §2.2); returns its
    ``1 - beta`` quantile (float64, in (0, 1); for beta 1e-7: 0.119 at
    n = 500, 0.060 at 14,400, i.e. one hour at 4 req/s, 0.052 at 24 h). Raises ``ValueError`` for beta outside (0, 1).
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    n = np.nan_to_num(np.asarray(base_n, dtype=np.float64), nan=0.0)
    r = np.floor(0.95 * (np.maximum(n, 2.0) - 1.0))
    return np.where(n >= 2, betaincinv(np.maximum(n, 2.0) - r, r + 1.0, 1.0 - beta), np.nan)


def shift_p_value(k: np.ndarray, n: np.ndarray, p0: np.ndarray) -> np.ndarray:
    """One-sided binomial p-value P(Binomial(n, p0) >= k), elementwise, shape (C,).

    ``k``, ``n``: counts (k <= n; k <= 0 gives 1); ``p0`` in (0, 1), NaN
    gives NaN (no test). Conover, "Practical Nonparametric Statistics", §3.1.
    """
    k = np.rint(np.nan_to_num(np.asarray(k, dtype=np.float64))).astype(np.int64)
    n = np.rint(np.nan_to_num(np.asarray(n, dtype=np.float64))).astype(np.int64)
    p0 = np.asarray(p0, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        p = bdtrc(np.clip(k - 1, 0, None), np.maximum(n, k).clip(1), np.nan_to_num(p0, nan=0.5))
    return np.where(k <= 0, 1.0, np.where(np.isnan(p0), np.nan, p))


class LatencyWindows(RingWindows):
    """The latency histograms of ``ok`` requests: ``short`` (10 × 30 s; 10 s slots when the 5 min window is
    not a multiple of 30 s) and ``base`` (``baseline_hours + 1`` × 1 h), both ``n_buckets`` wide.

    ``buckets``: the bucket mapping (default :class:`LatencyBuckets`: 2 %, 1 ms .. 10 min);
    ``min_latency`` / ``min_baseline`` (>= 1): samples below which a P95 (5 min and 30 s / baseline)
    is NaN. Baseline P95s are computed once per channel and event-time hour (cached; a late event
    into a covered hour or a row change drops a channel's cache).
    """

    name = "latency_p95_ratio"

    def __init__(self, spec: WindowSpec, buckets: LatencyBuckets | None = None):
        self.buckets = buckets or LatencyBuckets()
        self.window_ms = spec.window_ms
        self.baseline_hours = spec.baseline_hours
        self.min_latency = 1
        self.min_baseline = 1
        k = self.buckets.n_buckets
        lat_ms = LAT_SLOT_MS if spec.window_ms % LAT_SLOT_MS == 0 else SHORT_SLOT_MS
        self.short = IntervalRing(lat_ms, spec.window_ms // lat_ms, 0, k)
        self.base = IntervalRing(BASE_SLOT_MS, spec.baseline_hours + 1, 0, k)
        self.rings = {"short": self.short, "base": self.base}
        self._base_hour = np.full(16, -1, dtype=np.int64)  # per channel: the hour its cached baseline is for
        self._base_vals = np.full((16, 3), np.nan)  # per channel: P95, samples, hours
        self._base_min = 1

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """:meth:`add_learning` with every event learning."""
        self.add_learning(cols, late, None)

    def add_learning(self, cols: EventColumns, late: np.ndarray, learn: np.ndarray | None) -> None:
        """Count the ``ok`` latencies: in the short ring unless ``late``, in the baseline where ``learn``
        (bool (n,); None: always; SPEC §4.2: a channel's non-healthy minutes stay out of its baseline)."""
        key = self.buckets.key_of(cols.latency_ms)
        self.short.add(cols.channel, cols.ts_ms, None, cols.ok & ~late, key)
        self.base.add(cols.channel, cols.ts_ms, None, cols.ok if learn is None else cols.ok & learn, key)
        if self._base_hour.shape[0] > 0:
            hours = cols.ts_ms // BASE_SLOT_MS
            known = cols.channel < self._base_hour.shape[0]
            touched = cols.channel[known][hours[known] < self._base_hour[cols.channel[known]]]
            if touched.size:  # a late event landed in an hour a cached baseline covers
                self._base_hour[np.unique(touched)] = -1

    def _baseline(self, now_ms: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Baseline P95 / samples / hours for ``rows`` at ``now_ms``, cached per channel and hour."""
        hour = now_ms // BASE_SLOT_MS
        c = self.base.capacity
        if self._base_hour.shape[0] < c or self._base_min != self.min_baseline:
            grow = max(c, 16) - self._base_hour.shape[0]
            if grow > 0:
                self._base_hour = np.concatenate([self._base_hour, np.full(grow, -1, np.int64)])
                self._base_vals = np.concatenate([self._base_vals, np.full((grow, 3), np.nan)])
            if self._base_min != self.min_baseline:
                self._base_hour[:] = -1
                self._base_min = self.min_baseline
        stale = rows[self._base_hour[rows] != hour]
        if stale.size:
            ids = self.base.slot_id[stale]
            mask = ((ids >= max(hour - self.baseline_hours, 0)) & (ids < hour)).astype(np.float32)
            hist = self.base.sum_hist(mask, stale)
            self._base_vals[stale, 0] = self.buckets.quantile(hist, 0.95, min_count=self.min_baseline)
            self._base_vals[stale, 1] = hist.sum(axis=1)
            self._base_vals[stale, 2] = mask.sum(axis=1)
            self._base_hour[stale] = hour
        v = self._base_vals[rows]
        return v[:, 0], v[:, 1], v[:, 2]

    def invalidate_baseline(self, rows: np.ndarray | None = None) -> None:
        """Drop cached baselines (of channels ``rows``, or all) after the rings changed outside :meth:`add`."""
        if rows is None:
            self._base_hour[:] = -1
        else:
            rows = np.asarray(rows, dtype=np.int64)
            self._base_hour[rows[rows < self._base_hour.shape[0]]] = -1

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        """``p95_ms``, ``n_latency_5m``, ``p95_lower_ms`` (99 %), ``p95_lower_30s_ms`` (95 %),
        ``n_latency_30s``, ``p95_30s_ms``, ``n_shift_30s`` (samples of the last slot above 1.2 × the
        baseline P95) and ``base_p95_ms`` / ``base_n`` / ``base_hours`` (:class:`WindowView`)."""
        n = rows.shape[0]
        mq = self.min_latency
        hi = -(-now_ms // SHORT_SLOT_MS)  # 10 s slots strictly before the one after now
        lo = np.full(n, max(hi - self.window_ms // SHORT_SLOT_MS, 0), dtype=np.int64)
        if since_ms is not None:
            lo = np.maximum(lo, -(-np.asarray(since_ms, dtype=np.int64) // SHORT_SLOT_MS))
        lat = self.short
        per = lat.slot_ms // SHORT_SLOT_MS  # 10 s slots per latency slot; window ends are whole latency slots
        sel = row_selector(rows)
        lat_ids = lat.slot_id[sel]
        lat_lo = -(-lo // per)
        lat_hi = -(-hi // per)
        h5 = lat.sum_hist(((lat_ids >= lat_lo[:, None]) & (lat_ids < lat_hi)).astype(np.float32), sel)
        h30 = lat.sum_hist(((lat_ids >= np.maximum(lat_lo, lat_hi - 1)[:, None]) & (lat_ids < lat_hi))
                           .astype(np.float32), sel)
        base_p95, base_n, base_hours = self._baseline(now_ms, rows)
        b = self.buckets
        return {
            "p95_ms": b.quantile(h5, 0.95, min_count=mq), "n_latency_5m": h5.sum(axis=1),
            "p95_lower_ms": b.quantile_bound(h5, 0.95, P95_BOUND_CONFIDENCE, min_count=mq),
            "p95_lower_30s_ms": b.quantile_bound(h30, 0.95, P95_BOUND_CONFIDENCE_30S, min_count=mq),
            "n_latency_30s": h30.sum(axis=1), "p95_30s_ms": b.quantile(h30, 0.95, min_count=mq),
            "n_shift_30s": b.count_above(h30, base_p95, SHIFT_NULL_RATIO),
            "base_p95_ms": base_p95, "base_n": base_n, "base_hours": base_hours,
        }

    def clear_rows(self, rows: np.ndarray) -> None:
        super().clear_rows(rows)
        self.invalidate_baseline(rows)

    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        super().import_row(i, arrays)
        self.invalidate_baseline(np.array([i]))


@dataclass(frozen=True)
class LatencyParams(Params):
    """Thresholds of ``latency_p95_ratio`` (policy table ``[tier.X.latency_p95_ratio]``)."""

    #: SPEC §4.3: P95(5 min) / P95(24 h baseline) that degrades the channel (dimensionless, > clear) ...
    latency_ratio_trip: float = 1.8
    #: ... and the ratio at or below which the finding clears (hysteresis; >= 1).
    latency_ratio_clear: float = 1.2
    #: Minimum successful requests in the 5 min window for a P95 (>= 1).
    latency_min_requests: int = param(50, ge=1)
    #: Minimum successful requests in the 24 h baseline (>= 1).
    baseline_min_requests: int = param(500, ge=1)
    #: Minimum whole hours of history before the baseline is trusted (>= 1).
    baseline_min_hours: int = param(1, ge=1)

    ORDER = (Order("latency_ratio_clear", "latency_ratio_trip", floor=1),)


class LatencyRatio:
    """Soft signal ``latency_p95_ratio`` (degrades)."""

    reason = "latency_p95_ratio"

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Trip on a P95 lower bound (5 min or 30 s) or the 30 s shift rule ≥ 1.8 × baseline; clear ≤ 1.2."""
        ratio = safe_ratio(view.p95_ms, view.base_p95_ms)
        base_ok = (view.base_n >= th.baseline_min_requests) & (view.base_hours >= th.baseline_min_hours)
        lo5 = np.where(view.n_latency_5m >= th.latency_min_requests, safe_ratio(view.p95_lower_ms, view.base_p95_ms),
                       np.nan)
        lo30 = np.where(view.n_latency_30s >= th.latency_min_requests,
                        safe_ratio(view.p95_lower_30s_ms, view.base_p95_ms), np.nan)
        lower = np.fmax(lo5, lo30)
        ratio30 = safe_ratio(view.p95_30s_ms, view.base_p95_ms)
        # the test only where the effect size holds (rare): NaN elsewhere, no scipy call on a quiet round
        big = np.flatnonzero((view.n_latency_30s >= th.latency_min_requests)
                             & (np.nan_to_num(ratio30) >= th.latency_ratio_trip))
        shift_p = np.full(ratio30.shape, np.nan)
        if big.size:
            shift_p[big] = shift_p_value(view.n_shift_30s[big], view.n_latency_30s[big],
                                         baseline_tail_share(view.base_n[big]))
        shift = np.nan_to_num(shift_p, nan=1.0) <= SHIFT_ALPHA
        valid = base_ok & (view.n_latency_5m >= th.latency_min_requests) & np.isfinite(ratio)
        trip = base_ok & ((np.nan_to_num(lower) >= th.latency_ratio_trip) | shift)
        fired = np.where(active, np.where(valid, ratio > th.latency_ratio_clear, True), trip)
        return Finding(self.reason, fired, {
            "p95_ms": view.p95_ms,
            "baseline_p95_ms": view.base_p95_ms,
            "latency_p95_ratio": ratio,
            "latency_p95_lower_ratio": lower,
            "latency_p95_30s_ratio": ratio30,
            "latency_shift_p": shift_p,  # NaN unless the 30 s P95 ratio is at or above the trip line
            "latency_samples_5m": view.n_latency_5m,
            "baseline_samples": view.base_n,
        })


SIGNAL = Signal(
    name="latency_p95_ratio", kind="soft", params=LatencyParams, detector=LatencyRatio(), windows=LatencyWindows,
    features=("p95_ms", "n_latency_5m", "p95_lower_ms", "p95_lower_30s_ms", "n_latency_30s", "p95_30s_ms",
              "n_shift_30s", "base_p95_ms", "base_n", "base_hours"),
    metrics=("p95_ms", "baseline_p95_ms", "latency_p95_ratio", "latency_p95_lower_ratio", "latency_p95_30s_ratio",
             "latency_shift_p", "latency_samples_5m", "baseline_samples"),
    examples=Examples(
        firing={"p95_ms": 500.0, "p95_lower_ms": 420.0, "n_latency_5m": 3_000},
        thin=({"p95_ms": 1_000.0, "p95_lower_ms": 1_000.0, "n_latency_5m": 49, "base_p95_ms": 100.0,
               "base_n": 10_000, "base_hours": 24},
              {"p95_ms": 1_000.0, "p95_lower_ms": 1_000.0, "n_latency_5m": 500, "base_p95_ms": 100.0, "base_n": 499,
               "base_hours": 24},
              {"p95_ms": 1_000.0, "p95_lower_ms": 1_000.0, "n_latency_5m": 500, "base_p95_ms": 100.0,
               "base_n": 10_000, "base_hours": 0},
              {"p95_ms": 1_000.0, "p95_lower_ms": 150.0, "n_latency_5m": 60, "base_p95_ms": 100.0,
               "base_n": 10_000, "base_hours": 24})),
    rule="Order-statistic lower confidence bound of the P95 of `ok` requests (99 % over 5 min, or 95 % over the last 30 s) "
         "÷ P95 over the 24 complete hours before the current hour; or the last 30 s P95 ratio when a binomial test "
         "(p ≤ 1e-7) shows the bulk moved past 1.2 × the baseline P95; clears on the 5 min P95 ratio",
    default="degrade ≥ 1.8, clear ≤ 1.2",
)
