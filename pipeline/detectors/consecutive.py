"""SPEC §4.2 consecutive failures over the channel's last 100 requests.

Highest priority: the engine checks it on every batch (pre-trip), not only
at evaluation rounds. The run comes from :class:`pipeline.windows.runs.RunTracker`.
"""

from __future__ import annotations

import numpy as np

from pipeline.detectors.base import Finding, ThresholdArrays
from pipeline.windows.store import WindowView


class ConsecutiveFailures:
    """Hard signal ``consecutive_failures``: run >= ``th.consecutive_failures``."""

    reason = "consecutive_failures"

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Fire where the trailing run reaches the threshold."""
        fired = view.run >= th.consecutive_failures
        return Finding(self.reason, fired, {"consecutive_failures": view.run})

    @staticmethod
    def trips(max_run: np.ndarray, threshold: np.ndarray) -> np.ndarray:
        """Pre-trip test on a batch's longest runs (bool, same shape)."""
        return max_run >= threshold
