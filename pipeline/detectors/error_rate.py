"""SPEC §4.1 error rate over 1 min and 5 min, decided by a Wilson bound.

A window trips when it holds at least ``error_min_requests`` judged requests
(success or upstream failure; ``cancelled``/``filtered`` excluded), at least
``error_min_failures`` failures, and the
Wilson lower bound of its failure rate at ``confidence`` (default 99.99 %
one-sided) exceeds the tier's line (0.5 % paid, 0.35 % free). With the lower
bound, "1 failure in 20 requests" (bound 0.31 %) does not trip a 0.5 % line,
while 8 failures in 600 requests does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays, safe_ratio, wilson_bounds, z_for
from pipeline.detectors.signal import Examples, Signal
from pipeline.windows.store import WindowView


@dataclass(frozen=True)
class ErrorRateParams:
    """Thresholds of ``error_rate`` (policy table ``[tier.X.error_rate]``)."""

    #: SPEC §4.1: trip line, a failure fraction in (0, 1): 0.5 % paid (0.35 % free, ``tier_defaults``).
    error_rate_trip: float = 0.005
    #: SPEC §4.1: minimum judged requests in a window before the test applies (>= 1).
    error_min_requests: int = 30
    #: Minimum failures in a window before it may trip (>= 1): keeps the 1 min window
    #: quiet on clean days (at 0.2 % and 10 req/s, P(>= 8 failures in 1 min)
    #: is about 1e-5).
    error_min_failures: int = 8

    def __post_init__(self) -> None:
        if not 0.0 < self.error_rate_trip < 1.0:
            raise ValueError(f"error_rate_trip must be in (0, 1), got {self.error_rate_trip}")
        for name in ("error_min_requests", "error_min_failures"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class ErrorRate:
    """Hard signal ``error_rate`` (opens the circuit)."""

    reason = "error_rate"

    def __init__(self, confidence: float = 0.9999):
        self.z = z_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Fire where either window's lower bound exceeds ``th.error_rate_trip``."""
        lo1, _ = wilson_bounds(view.failures_1m, view.judged_1m, self.z)
        lo5, _ = wilson_bounds(view.failures_5m, view.judged_5m, self.z)
        trip = th.error_rate_trip
        enough1 = (view.judged_1m >= th.error_min_requests) & (view.failures_1m >= th.error_min_failures)
        enough5 = (view.judged_5m >= th.error_min_requests) & (view.failures_5m >= th.error_min_failures)
        fired = (enough1 & (np.nan_to_num(lo1) > trip)) | (enough5 & (np.nan_to_num(lo5) > trip))
        return Finding(self.reason, fired, {
            "error_rate_1m": safe_ratio(view.failures_1m, view.judged_1m),
            "error_rate_5m": safe_ratio(view.failures_5m, view.judged_5m),
            "error_rate_lower_5m": lo5,
            "requests_1m": view.judged_1m,
            "requests_5m": view.judged_5m,
            "error_rate_trip": trip,
        })


SIGNAL = Signal(
    name="error_rate", kind="hard", params=ErrorRateParams, detector=ErrorRate(),
    tier_defaults={"free": {"error_rate_trip": 0.0035}},  # SPEC §4.1: free channels fail less at baseline
    features=("judged_1m", "failures_1m", "judged_5m", "failures_5m"),
    metrics=("error_rate_1m", "error_rate_5m", "error_rate_lower_5m", "requests_1m", "requests_5m",
             "error_rate_trip"),
    examples=Examples(
        firing={"judged_1m": 600, "failures_1m": 30, "judged_5m": 600, "failures_5m": 30},
        thin=({"judged_1m": 29, "failures_1m": 29, "judged_5m": 29, "failures_5m": 29},
              {"judged_1m": 1_000, "failures_1m": 7, "judged_5m": 1_000, "failures_5m": 7}),
        all_failures_fires=True),
    rule="Wilson lower bound (99.99 % one-sided) of failures / requests over 1 min and 5 min above the tier "
         "line, with ≥ 30 requests and ≥ 8 failures in the window; `cancelled`/`filtered` are not failures",
    default="paid 0.5 %, free 0.35 %",
)
