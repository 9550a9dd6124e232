"""SPEC §4.4 structured-field missing rate over 5 min.

rate = (ok answers missing an expected field or unparseable) / (ok answers
whose structure was checked). Fires when the Wilson lower bound of the rate
(99.99 % one-sided) exceeds ``missing_rate_trip`` (1 %) with at least
``missing_min_checked`` checked answers; clears when the point estimate is
back at or below half the trip line (hysteresis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays, safe_ratio, wilson_bounds, z_for
from pipeline.detectors.signal import Examples, Signal
from pipeline.windows.store import WindowView


@dataclass(frozen=True)
class MissingFieldsParams:
    """Thresholds of ``missing_fields`` (policy table ``[tier.X.missing_fields]``)."""

    #: SPEC §4.4: share in (0, 1) of checked ``ok`` answers missing a field that degrades.
    missing_rate_trip: float = 0.01
    #: Minimum checked ``ok`` answers in 5 min (>= 1).
    missing_min_checked: int = 50

    def __post_init__(self) -> None:
        if not 0.0 < self.missing_rate_trip < 1.0:
            raise ValueError(f"missing_rate_trip must be in (0, 1), got {self.missing_rate_trip}")
        if self.missing_min_checked < 1:
            raise ValueError(f"missing_min_checked must be >= 1, got {self.missing_min_checked}")


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


SIGNAL = Signal(
    name="missing_fields", kind="soft", params=MissingFieldsParams, detector=MissingFields(),
    features=("checked_5m", "missing_5m"),
    metrics=("missing_rate_5m", "missing_rate_lower_5m", "checked_5m"),
    examples=Examples(firing={"checked_5m": 1_500, "missing_5m": 45},
                      thin=({"checked_5m": 49, "missing_5m": 49},)),
    rule="Wilson lower bound of (ok answers missing a required field or unparseable) ÷ (checked ok answers) "
         "over 5 min",
    default="1 % (clears at ≤ 0.5 %)",
)
