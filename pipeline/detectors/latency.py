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
* clear: the 5 min point estimate at or below ``latency_ratio_clear`` (1.2)
  × baseline.

Needs ``baseline_min_requests`` samples in the baseline and
``baseline_min_hours`` hours of history; without enough evidence the
previous finding is kept (no evidence either way).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays, safe_ratio
from pipeline.detectors.signal import Examples, Signal
from pipeline.windows.view import WindowView


@dataclass(frozen=True)
class LatencyParams:
    """Thresholds of ``latency_p95_ratio`` (policy table ``[tier.X.latency_p95_ratio]``)."""

    #: SPEC §4.3: P95(5 min) / P95(24 h baseline) that degrades the channel (dimensionless, > clear) ...
    latency_ratio_trip: float = 1.8
    #: ... and the ratio at or below which the finding clears (hysteresis; >= 1).
    latency_ratio_clear: float = 1.2
    #: Minimum successful requests in the 5 min window for a P95 (>= 1).
    latency_min_requests: int = 50
    #: Minimum successful requests in the 24 h baseline (>= 1).
    baseline_min_requests: int = 500
    #: Minimum whole hours of history before the baseline is trusted (>= 1).
    baseline_min_hours: int = 1

    def __post_init__(self) -> None:
        if not 1.0 <= self.latency_ratio_clear < self.latency_ratio_trip:
            raise ValueError(f"need 1 <= latency_ratio_clear < latency_ratio_trip, got "
                             f"{self.latency_ratio_clear} and {self.latency_ratio_trip}")
        for name in ("latency_min_requests", "baseline_min_requests", "baseline_min_hours"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class LatencyRatio:
    """Soft signal ``latency_p95_ratio`` (degrades)."""

    reason = "latency_p95_ratio"

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Trip on the P95 lower bounds (5 min or last 30 s) ≥ 1.8 × baseline, clear on the point ratio ≤ 1.2."""
        ratio = safe_ratio(view.p95_ms, view.base_p95_ms)
        base_ok = (view.base_n >= th.baseline_min_requests) & (view.base_hours >= th.baseline_min_hours)
        lo5 = np.where(view.n_latency_5m >= th.latency_min_requests, safe_ratio(view.p95_lower_ms, view.base_p95_ms),
                       np.nan)
        lo30 = np.where(view.n_latency_30s >= th.latency_min_requests,
                        safe_ratio(view.p95_lower_30s_ms, view.base_p95_ms), np.nan)
        lower = np.fmax(lo5, lo30)
        valid = base_ok & (view.n_latency_5m >= th.latency_min_requests) & np.isfinite(ratio)
        trip = base_ok & (np.nan_to_num(lower) >= th.latency_ratio_trip)
        fired = np.where(active, np.where(valid, ratio > th.latency_ratio_clear, True), trip)
        return Finding(self.reason, fired, {
            "p95_ms": view.p95_ms,
            "baseline_p95_ms": view.base_p95_ms,
            "latency_p95_ratio": ratio,
            "latency_p95_lower_ratio": lower,
            "latency_samples_5m": view.n_latency_5m,
            "baseline_samples": view.base_n,
        })


SIGNAL = Signal(
    name="latency_p95_ratio", kind="soft", params=LatencyParams, detector=LatencyRatio(),
    features=("p95_ms", "n_latency_5m", "p95_lower_ms", "p95_lower_30s_ms", "n_latency_30s", "base_p95_ms",
              "base_n", "base_hours"),
    metrics=("p95_ms", "baseline_p95_ms", "latency_p95_ratio", "latency_p95_lower_ratio", "latency_samples_5m",
             "baseline_samples"),
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
         "÷ P95 over the 24 complete hours before the current hour; clears on the 5 min P95 ratio",
    default="degrade ≥ 1.8, clear ≤ 1.2",
)
