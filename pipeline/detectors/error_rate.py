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

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays, safe_ratio, wilson_bounds, z_for
from pipeline.windows.store import WindowView


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
