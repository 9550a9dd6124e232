"""SPEC §4.1 error rate: a Bernoulli CUSUM for creeping faults, an exact binomial bound for big jumps.

Sequential path (issue #19): a one-sided Bernoulli CUSUM on the channel's
per-10 s counts of judged requests and upstream failures
(:mod:`pipeline.windows.cusum`, Page 1954; Reynolds & Stoumbos 1999), in-control
rate ``p0`` = the channel's own 24 h rate (at least 0.005 %), tuned to catch
``p1 = max(p0 + 0.45 %, 2 p0)`` (0.46 % for a clean channel: about the paid
trip line), threshold ``h`` from an in-control average run length of 1000
channel-days at the channel's traffic (Siegmund's approximation less the
overshoot correction, exact ARL checked in ``tests/unit/test_cusum.py``).
Measured over seeded streams (same test): a 0 -> 5 % creep over 20 min at
4 req/s alarms after ~240 s (median), when the rate is ~1 %; 62 % of the
streams alarm by the 8th 30 s round (52 % with the 0.01 % floor and
Siegmund's plain ``h``): 4 min is the median, not a bound.

Fast path (OR): a window trips when it holds at least ``error_min_requests`` judged requests
(success or upstream failure; ``cancelled``/``filtered`` excluded), at least
``error_min_failures`` failures, and the exact (Clopper-Pearson 1934) lower
bound of its failure rate at ``confidence`` (default 99.9999 % one-sided)
exceeds the tier's line (0.5 % paid, 0.35 % free). Guarantee: a window whose
true rate is at the line trips with probability <= 1e-6, at every count
(``tests/unit/test_rate_bounds.py`` sums the exact binomial tail and draws
seeded windows). The Wilson bound it replaces broke that at small counts: 10
failures in ~691 requests (Wilson 0.36 %, exact 0.19 %) tripped a clean 0.2 %
free channel in the slow-failure scorecard (seed 18); at the line itself
P(X >= 10 | n = 700, p = 0.35 %) is 2.3e-4. 8 failures in 600 requests
(exact bound 0.32 %) no longer trips the 0.5 % line; 30 in 600 does (2.6 %).
The fast path runs at 99.9999 % so that it only catches jumps: at 99.99 % it
tripped once a clean day on a night-time 5 min window of a 0.3 % channel
(docs/SCORECARD.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Params, Signal, ThresholdArrays, param
from pipeline.stats import CusumDesign, alpha_for, cusum_alarm, exact_lower_gate, safe_ratio
from pipeline.windows.cusum import BernoulliCusum
from pipeline.windows.extension import WindowSpec
from pipeline.windows.view import WindowView

#: The CUSUM's design (module docstring): floor 0.005 %, shift 0.45 %, ARL0 1000 channel-days.
ERROR_CUSUM = CusumDesign(p_floor=0.00005, shift=0.0045, arl0_days=1000.0, prior_rate=0.005, prior_trials=500.0)


def error_windows(spec: WindowSpec) -> BernoulliCusum:
    """The error-rate CUSUM windows: trials = judged requests, events = upstream failures."""
    return BernoulliCusum(spec, "error_rate", "error", ERROR_CUSUM,
                          lambda c: c.outcome >= 0, lambda c: c.outcome == 1)


@dataclass(frozen=True)
class ErrorRateParams(Params):
    """Thresholds of ``error_rate`` (policy table ``[tier.X.error_rate]``)."""

    #: SPEC §4.1: trip line, a failure fraction in (0, 1): 0.5 % paid (0.35 % free, ``tier_defaults``).
    error_rate_trip: float = param(0.005, gt=0, lt=1)
    #: SPEC §4.1: minimum judged requests in a window before the test applies (>= 1).
    error_min_requests: int = param(30, ge=1)
    #: Minimum failures in a window before it may trip (>= 1): keeps the 1 min window
    #: quiet on clean days (at 0.2 % and 10 req/s, P(>= 8 failures in 1 min)
    #: is about 1e-5).
    error_min_failures: int = param(8, ge=1)


class ErrorRate:
    """Hard signal ``error_rate`` (opens the circuit)."""

    reason = "error_rate"

    def __init__(self, confidence: float = 0.999999):
        self.alpha = alpha_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Fire where the CUSUM alarms (``S >= h``) or either window's exact lower bound exceeds
        ``th.error_rate_trip``; the bounds (metric ``error_rate_lower_5m``) are NaN where a window is
        too thin to be judged (fewer requests or failures than the minimums) or its rate is at or under
        the line (so is the bound)."""
        trip = th.error_rate_trip
        enough1 = (view.judged_1m >= th.error_min_requests) & (view.failures_1m >= th.error_min_failures)
        enough5 = (view.judged_5m >= th.error_min_requests) & (view.failures_5m >= th.error_min_failures)
        above1, _ = exact_lower_gate(view.failures_1m, view.judged_1m, trip, self.alpha, enough1)
        above5, lo5 = exact_lower_gate(view.failures_5m, view.judged_5m, trip, self.alpha, enough5)
        fired = above1 | above5
        s, h = view.error_cusum, view.error_cusum_h
        fired |= cusum_alarm(s, h)
        return Finding(self.reason, fired, {
            "error_rate_1m": safe_ratio(view.failures_1m, view.judged_1m),
            "error_rate_5m": safe_ratio(view.failures_5m, view.judged_5m),
            "error_rate_lower_5m": lo5,
            "requests_1m": view.judged_1m,
            "requests_5m": view.judged_5m,
            "error_rate_trip": trip,
            "error_cusum": s,
            "error_cusum_h": h,
            "error_baseline_rate": view.error_p0,
        })


SIGNAL = Signal(
    name="error_rate", kind="hard", params=ErrorRateParams, detector=ErrorRate(),
    tier_defaults={"free": {"error_rate_trip": 0.0035}},  # SPEC §4.1: free channels fail less at baseline
    features=("judged_1m", "failures_1m", "judged_5m", "failures_5m", "error_cusum", "error_cusum_h", "error_p0"),
    metrics=("error_rate_1m", "error_rate_5m", "error_rate_lower_5m", "requests_1m", "requests_5m",
             "error_rate_trip", "error_cusum", "error_cusum_h", "error_baseline_rate"),
    windows=error_windows,
    examples=Examples(
        firing={"judged_1m": 600, "failures_1m": 30, "judged_5m": 600, "failures_5m": 30},
        thin=({"judged_1m": 29, "failures_1m": 29, "judged_5m": 29, "failures_5m": 29},
              {"judged_1m": 1_000, "failures_1m": 7, "judged_5m": 1_000, "failures_5m": 7},
              {"error_cusum": 9.0, "error_cusum_h": 14.0}),
        all_failures_fires=True),
    rule="Bernoulli CUSUM of failures on 10 s counts against the channel's own 24 h rate (≥ 0.005 %), tuned to "
         "+0.45 %, h for 1 false alarm per 1000 channel-days; or (jumps) the exact (Clopper-Pearson) lower bound (99.9999 % "
         "one-sided) over 1 min or 5 min above the tier line with ≥ 30 requests and ≥ 8 failures; "
         "`cancelled`/`filtered` are not failures",
    default="paid 0.5 %, free 0.35 %",
)
