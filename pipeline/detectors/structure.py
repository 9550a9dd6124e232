"""SPEC §4.4 structured-field missing rate over 5 min.

rate = (ok answers missing an expected field or unparseable) / (ok answers
whose structure was checked). Fires when the Wilson lower bound of the rate
(99.99 % one-sided) exceeds ``missing_rate_trip`` (1 %) with at least
``missing_min_checked`` checked answers; clears when the point estimate is
back at or below half the trip line (hysteresis).
"""

from __future__ import annotations

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays, safe_ratio, wilson_bounds, z_for
from pipeline.windows.store import WindowView


class MissingFields:
    """Soft signal ``missing_fields`` (pre-emptive down-weight)."""

    reason = "missing_fields"

    def __init__(self, confidence: float = 0.9999):
        self.z = z_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Trip on the lower bound, clear on the point estimate."""
        rate = safe_ratio(view.missing_5m, view.checked_5m)
        lo, _ = wilson_bounds(view.missing_5m, view.checked_5m, self.z)
        enough = view.checked_5m >= th.missing_min_checked
        trip = enough & (np.nan_to_num(lo) > th.missing_rate_trip)
        keep = active & ~(enough & (np.nan_to_num(rate) <= 0.5 * th.missing_rate_trip))
        return Finding(self.reason, trip | keep, {
            "missing_rate_5m": rate,
            "missing_rate_lower_5m": lo,
            "checked_5m": view.checked_5m,
        })
