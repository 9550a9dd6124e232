"""SPEC §4.2 consecutive failures over the channel's last 100 requests.

Highest priority: the engine checks it on every batch (pre-trip), not only
at evaluation rounds. The run comes from :class:`pipeline.windows.runs.RunTracker`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Params, Signal, ThresholdArrays, param
from pipeline.windows.view import WindowView


@dataclass(frozen=True)
class ConsecutiveParams(Params):
    """Thresholds of ``consecutive_failures`` (policy table ``[tier.X.consecutive_failures]``)."""

    #: SPEC §4.2: a run of this many consecutive failures pre-trips the channel (requests, 1..100).
    consecutive_failures: int = param(5, ge=1, le=100, says="in 1..100 (the run window, SPEC §4.2)")


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


SIGNAL = Signal(
    name="consecutive_failures", kind="hard", params=ConsecutiveParams, detector=ConsecutiveFailures(),
    features=("run",), metrics=("consecutive_failures",),
    examples=Examples(firing={"run": 5}, thin=({"run": 4},), all_failures_fires=True),
    rule="trailing run over the channel's last 100 requests, however far apart in time; checked on every "
         "batch (pre-trip)",
    default="5 (2 while half-open)",
)
