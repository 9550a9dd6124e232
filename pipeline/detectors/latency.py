"""SPEC §4.3 P95 latency over 5 min vs the rolling 24 h baseline P95.

ratio = P95(ok requests, last 5 min) / P95(ok requests, 24 complete hours
before the current hour). Fires at ratio >= ``latency_ratio_trip`` (1.8) and
stays fired until ratio <= ``latency_ratio_clear`` (1.2): hysteresis, so a
ratio hovering around one line does not flap. Needs ``latency_min_requests``
samples in 5 min, ``baseline_min_requests`` in the baseline and
``baseline_min_hours`` hours of history; without them the previous finding
is kept (no evidence either way).
"""

from __future__ import annotations

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays, safe_ratio
from pipeline.windows.store import WindowView


class LatencyRatio:
    """Soft signal ``latency_p95_ratio`` (degrades)."""

    reason = "latency_p95_ratio"

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Apply the 1.8 / 1.2 hysteresis on the P95 ratio."""
        ratio = safe_ratio(view.p95_ms, view.base_p95_ms)
        valid = (
            (view.n_latency_5m >= th.latency_min_requests)
            & (view.base_n >= th.baseline_min_requests)
            & (view.base_hours >= th.baseline_min_hours)
            & np.isfinite(ratio)
        )
        rule = np.where(active, ratio > th.latency_ratio_clear, ratio >= th.latency_ratio_trip)
        fired = np.where(valid, rule, active)
        return Finding(self.reason, fired, {
            "p95_ms": view.p95_ms,
            "baseline_p95_ms": view.base_p95_ms,
            "latency_p95_ratio": ratio,
            "latency_samples_5m": view.n_latency_5m,
            "baseline_samples": view.base_n,
        })
