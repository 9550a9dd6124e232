"""SPEC §4.2 consecutive failures over the channel's last 100 requests.

Highest priority: the engine checks it on every batch (pre-trip), not only
at evaluation rounds. The run comes from :class:`FailureRuns`, the signal's
windows: a :class:`pipeline.windows.runs.RunTracker` (one int32 per channel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from pipeline.signals.base import Examples, Finding, Params, Signal, ThresholdArrays, param
from pipeline.windows.extension import SignalWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.runs import RunTracker
from pipeline.windows.view import WindowView

#: SPEC §4.2: the run is counted over the channel's last 100 requests (its cap).
RUN_WINDOW = 100


class FailureRuns(SignalWindows):
    """The trailing consecutive-failure run per channel (feature ``run``; array ``run``, int32 0-d, per row).

    Pre-trip (SPEC §4.2, engine code): set :attr:`threshold` (per channel, shape (C,)) before the
    store adds a batch; :meth:`add` then leaves the batch's ``groups`` (channels touched, sorted int64),
    ``max_run`` (per group, the longest run reached in the batch, int32) and ``crossed_at`` (per group, the input index of the first event whose run reached the threshold,
    -1: none), as :meth:`RunTracker.update` gives them.
    """

    name = "consecutive_failures"

    def __init__(self, spec: WindowSpec, window: int = RUN_WINDOW):
        self.tracker = RunTracker(window)
        self.threshold: np.ndarray | None = None
        #: A second, lower run per channel (shape (C,); None: none) whose first crossings :meth:`add` leaves
        #: in ``crossed_early`` (per group, -1: none): the engine's suspicion (pipeline/engine/suspects.py).
        self.early: np.ndarray | None = None
        self.crossed_early = np.zeros(0, np.int64)
        self.groups = np.zeros(0, np.int64)
        self.max_run = np.zeros(0, np.int32)
        self.crossed_at = np.zeros(0, np.int64)

    def ensure_capacity(self, n_channels: int) -> None:
        self.tracker.ensure_capacity(n_channels)

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """Runs continue over every judged event, ``late`` ones too (runs count requests, not time)."""
        self.groups, self.max_run = self.tracker.update(cols.channel, cols.outcome, self.threshold, self.early)
        self.crossed_at = self.tracker.crossed_at
        self.crossed_early = self.tracker.crossed_early

    def reset(self, row: int) -> None:
        """Forget channel ``row``'s run (entering ``half_open``: only the probes count)."""
        self.tracker.reset(row)

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        return {"run": self.tracker.trailing[rows].astype(np.float64)}

    def clear_rows(self, rows: np.ndarray) -> None:
        self.tracker.trailing[np.asarray(rows, dtype=np.int64)] = 0

    def export_row(self, i: int) -> dict[str, np.ndarray]:
        return {"run": np.array(self.tracker.trailing[i], dtype=np.int32)}

    def row_layout(self) -> dict[str, tuple[int, ...]]:
        return {"run": ()}

    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        """Load a run (None: 0); raises ``ValueError`` unless it is one integer in ``0 .. 2**31 - 1``."""
        if arrays is None:
            self.tracker.trailing[i] = 0
            return
        run = arrays.get("run")
        if run is None or np.shape(run) != () or not 0 <= int(run) <= np.iinfo(np.int32).max:
            raise ValueError(f"consecutive_failures windows: state run {run!r} is not one int in 0 .. 2**31 - 1")
        self.tracker.trailing[i] = int(run)


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
    windows=FailureRuns,
    features=("run",), metrics=("consecutive_failures",),
    examples=Examples(firing={"run": 5}, thin=({"run": 4},), all_failures_fires=True),
    rule="trailing run over the channel's last 100 requests, however far apart in time; checked on every "
         "batch (pre-trip)",
    default="5 (2 while half-open)",
)
