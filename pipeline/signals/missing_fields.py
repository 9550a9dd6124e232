"""SPEC §4.4 structured-field missing rate: a Bernoulli CUSUM, and a 5 min exact bound.

rate = (ok answers missing an expected field or unparseable) / (ok answers
whose structure was checked). Fires when either

* the one-sided Bernoulli CUSUM of hollow answers on 10 s counts
  (:mod:`pipeline.windows.cusum`; Page 1954, Reynolds & Stoumbos 1999)
  alarms: in-control rate ``p0`` = the channel's own 24 h rate (at least
  0.1 %), tuned to ``p1 = max(p0 + 1.5 %, 2 p0)`` (above the SPEC 1 % line),
  ``h`` for one false alarm per 1000 channel-days at the
  channel's traffic (Siegmund's approximation); measured over seeded streams
  (``tests/unit/test_cusum.py``): 3 % hollow at 4 req/s alarms after ~60 s (median);
* or the exact (Clopper-Pearson 1934) lower bound of the 5 min rate (99.99 %
  one-sided) exceeds ``missing_rate_trip`` (1 %) with at least
  ``missing_min_checked`` checked answers: a window at the line trips with
  probability <= 1e-4 at every count (``tests/unit/test_rate_bounds.py``).

It clears when neither holds and the 5 min point estimate is back at or
below half the trip line (hysteresis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Params, Signal, ThresholdArrays, param
from pipeline.stats import CusumDesign, alpha_for, cusum_alarm, exact_lower_gate, safe_ratio
from pipeline.windows.cusum import BernoulliCusum
from pipeline.windows.extension import WindowSpec
from pipeline.windows.view import WindowView

#: The CUSUM's design (module docstring): floor 0.1 %, shift 1.5 %, ARL0 1000 channel-days. A soft
#: finding does not restart its chart on a state change, so ``S`` is capped at 1.25 h: after the fault
#: the alarm ends within ~0.25 h / 0.015 ≈ 170 clean answers, inside the window rule's own clearing time.
MISSING_CUSUM = CusumDesign(p_floor=0.001, shift=0.015, arl0_days=1000.0, prior_rate=0.005, prior_trials=500.0,
                            cap_h=1.25)


def missing_windows(spec: WindowSpec) -> BernoulliCusum:
    """The missing-field CUSUM windows: trials = checked ok answers, events = hollow ones."""
    return BernoulliCusum(spec, "missing_fields", "missing", MISSING_CUSUM,
                          lambda c: c.checked & c.ok, lambda c: c.missing)


@dataclass(frozen=True)
class MissingFieldsParams(Params):
    """Thresholds of ``missing_fields`` (policy table ``[tier.X.missing_fields]``)."""

    #: SPEC §4.4: share in (0, 1) of checked ``ok`` answers missing a field that degrades.
    missing_rate_trip: float = param(0.01, gt=0, lt=1)
    #: Minimum checked ``ok`` answers in 5 min (>= 1).
    missing_min_checked: int = param(50, ge=1)


class MissingFields:
    """Soft signal ``missing_fields`` (pre-emptive down-weight)."""

    reason = "missing_fields"

    def __init__(self, confidence: float = 0.9999):
        self.alpha = alpha_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Trip on the CUSUM or the exact lower bound (NaN below ``missing_min_checked`` or where the rate
        is at or under the line, so the bound is too), clear on the point estimate."""
        rate = safe_ratio(view.missing_5m, view.checked_5m)
        enough = view.checked_5m >= th.missing_min_checked
        above, lo = exact_lower_gate(view.missing_5m, view.checked_5m, th.missing_rate_trip, self.alpha, enough)
        trip = above | cusum_alarm(view.missing_cusum, view.missing_cusum_h)
        keep = active & ~(enough & (np.nan_to_num(rate) <= 0.5 * th.missing_rate_trip))
        return Finding(self.reason, trip | keep, {
            "missing_rate_5m": rate,
            "missing_rate_lower_5m": lo,
            "checked_5m": view.checked_5m,
            "missing_cusum": view.missing_cusum,
            "missing_cusum_h": view.missing_cusum_h,
            "missing_baseline_rate": view.missing_p0,
        })


SIGNAL = Signal(
    name="missing_fields", kind="soft", params=MissingFieldsParams, detector=MissingFields(),
    features=("checked_5m", "missing_5m", "missing_cusum", "missing_cusum_h", "missing_p0"),
    metrics=("missing_rate_5m", "missing_rate_lower_5m", "checked_5m", "missing_cusum", "missing_cusum_h",
             "missing_baseline_rate"),
    windows=missing_windows,
    examples=Examples(firing={"checked_5m": 1_500, "missing_5m": 45},
                      thin=({"checked_5m": 49, "missing_5m": 49}, {"missing_cusum": 9.0, "missing_cusum_h": 14.0})),
    rule="Bernoulli CUSUM of (ok answers missing a required field or unparseable) on 10 s counts against the "
         "channel's own 24 h rate (≥ 0.1 %), tuned to +1.5 %, h for 1 false alarm per 1000 channel-days; or the "
         "exact (Clopper-Pearson) lower bound of that share over 5 min",
    default="1 % (clears at ≤ 0.5 %)",
)
