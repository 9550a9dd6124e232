"""Event-time rings of sampled quality scores (SPEC §4.5), per channel.

Two :class:`~pipeline.windows.ring.IntervalRing` s with three counters per
slot — sample count, sum of scores, sum of squared scores — so a window's
mean and variance come from sums (batched matrix products, no sample lists):

- short: 30 × 10 s slots (the 5 min window of SPEC §4.5);
- baseline: 25 × 1 h slots (the 24 complete hours before the current hour,
  plus the hour being filled), like the latency baseline of SPEC §4.3.

Scores are only comparable within one quality-model version (see the model
card), so every channel records the version its scores came from; a score
of another version resets that channel's rings first (:meth:`QualityWindows.add`).

Scores arrive *after* their events (the worker scores off the event loop,
so scoring lags event time, by seconds live and by more in a fast backlog
replay). :meth:`QualityWindows.aggregates` therefore anchors a channel's
5 min window at its newest scored slot (never after ``now``): the detector
judges the latest five minutes that have been scored instead of a window
whose recent part is still being scored. Scores older than ``max_lag_ms``
(10 min) behind ``now`` count as no evidence.
Memory per channel: (30 + 25) × 3 × 4 bytes ≈ 0.7 KB.
"""

from __future__ import annotations

import numpy as np

from pipeline.windows.ring import IntervalRing

#: Counter columns of both rings.
Q_N, Q_SUM, Q_SUMSQ = range(3)
N_Q_COUNTERS = 3
#: Scores whose newest slot ends more than this before ``now`` are stale (no evidence).
DEFAULT_MAX_LAG_MS = 600_000


def moments(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(n, mean, sample variance)`` from rows of ``[n, sum, sum_sq]`` (float64 (C, 3)).

    Mean is NaN where ``n == 0``; variance (ddof 1, clipped at 0) is NaN where
    ``n < 2``. No warnings.

    >>> n, m, v = moments(np.array([[2.0, 1.0, 0.5], [0.0, 0.0, 0.0]]))
    >>> n.tolist(), m.tolist()[0], v.tolist()[0], bool(np.isnan(m[1]))
    ([2.0, 0.0], 0.5, 0.0, True)
    """
    sums = np.asarray(sums, dtype=np.float64)
    n = sums[:, Q_N]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n > 0, sums[:, Q_SUM] / np.where(n > 0, n, 1.0), np.nan)
        ss = sums[:, Q_SUMSQ] - np.where(n > 0, sums[:, Q_SUM] ** 2 / np.where(n > 0, n, 1.0), 0.0)
        var = np.where(n >= 2, np.maximum(ss, 0.0) / np.where(n >= 2, n - 1.0, 1.0), np.nan)
    return n, mean, var


class QualityWindows:
    """Quality-score rings for all channels of a worker.

    ``short_slot_ms`` × ``short_slots`` is the short window (10 s × 30);
    ``base_slot_ms`` × ``base_slots`` the baseline ring (1 h × 25). Channel
    rows grow with :meth:`ensure_capacity` (the store calls it on registration).
    """

    def __init__(self, short_slot_ms: int = 10_000, short_slots: int = 30,
                 base_slot_ms: int = 3_600_000, base_slots: int = 25):
        self.short = IntervalRing(short_slot_ms, short_slots, N_Q_COUNTERS, 0)
        self.base = IntervalRing(base_slot_ms, base_slots, N_Q_COUNTERS, 0)
        #: Per channel: quality-model version of the scores held (None: none yet).
        self.version: list[str | None] = []

    def ensure_capacity(self, n_channels: int) -> None:
        """Make channel indices < ``n_channels`` valid."""
        self.short.ensure_capacity(n_channels)
        self.base.ensure_capacity(n_channels)
        if len(self.version) < n_channels:
            self.version.extend([None] * (n_channels - len(self.version)))

    def reset(self, rows: np.ndarray | list[int]) -> None:
        """Forget every score of channels ``rows`` (both rings)."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return
        for ring in (self.short, self.base):
            ring.slot_id[rows] = -1
            ring.counts[rows] = 0.0

    def add(self, channel: np.ndarray, ts_ms: np.ndarray, scores: np.ndarray,
            version: str | None = None) -> tuple[np.ndarray, list[int]]:
        """Add scores in [0, 1]; returns ``(too_old, reset_rows)``.

        ``too_old`` bool (n,): scores older than the short ring (they still
        count in the baseline when its hour is held). ``reset_rows``: channels
        whose rings were cleared first because ``version`` differs from the
        version of the scores they held.
        """
        channel = np.asarray(channel, dtype=np.int64)
        ts_ms = np.asarray(ts_ms, dtype=np.int64)
        s = np.asarray(scores, dtype=np.float64)
        reset_rows: list[int] = []
        if version is not None:
            for c in np.unique(channel).tolist():
                if self.version[c] != version:
                    if self.version[c] is not None:
                        reset_rows.append(c)
                    self.version[c] = version
            self.reset(reset_rows)
        rows = np.stack([np.ones_like(s), s, s * s], axis=1).astype(np.float32)
        too_old = self.short.add(channel, ts_ms, rows)
        self.base.add(channel, ts_ms, rows)
        return too_old, reset_rows

    def window(self, rows: np.ndarray, lo_slot: np.ndarray | int, hi_slot: np.ndarray | int) -> np.ndarray:
        """Sums ``[n, sum, sum_sq]`` over short slots in ``[lo_slot, hi_slot)`` (scalars or per row) for the
        channels ``rows`` (unique indices): float64 (len(rows), 3)."""
        ids = self.short.slot_id[rows]
        lo = np.broadcast_to(np.asarray(lo_slot, dtype=np.int64), (len(rows),))[:, None]
        hi = np.broadcast_to(np.asarray(hi_slot, dtype=np.int64), (len(rows),))[:, None]
        m = ((ids >= lo) & (ids < hi)).astype(np.float32)
        return self.short.sum_counts(m, rows)

    def baseline(self, rows: np.ndarray, end_ms: np.ndarray | int, hours: int) -> tuple[np.ndarray, np.ndarray]:
        """Sums over the ``hours`` complete hours before the hour of ``end_ms`` (scalar or per
        row) for the channels ``rows`` (unique indices), and the hours present.

        Returns ``(sums float64 (len(rows), 3), hours_present float64 (len(rows),))``.
        """
        hour = np.broadcast_to(np.asarray(end_ms, dtype=np.int64) // self.base.slot_ms, (len(rows),))[:, None]
        ids = self.base.slot_id[rows]
        m = ((ids >= np.maximum(hour - hours, 0)) & (ids < hour)).astype(np.float32)
        sums = self.base.sum_counts(m, rows)
        present = (m * (self.base.counts[rows][:, :, Q_N] > 0)).sum(axis=1).astype(np.float64)
        return sums, present

    def aggregates(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None = None,
                   baseline_hours: int = 24, max_lag_ms: int = DEFAULT_MAX_LAG_MS) -> dict[str, np.ndarray]:
        """The quality fields of :class:`~pipeline.windows.view.WindowView` for ``rows`` at ``now_ms``.

        Per channel the window is the ``short.n_slots`` slots up to and
        including its newest scored slot, never past ``now_ms``'s slot, and
        starting no earlier than ``since_ms`` (slot granularity, rounded
        up). The baseline is the ``baseline_hours`` complete hours before the
        hour in which that window ends. ``quality_lag_ms``: event time
        between the window's end and ``now_ms`` (NaN without scores); beyond
        ``max_lag_ms`` the window counts as empty.
        """
        rows = np.asarray(rows, dtype=np.int64)
        slot = self.short.slot_ms
        hi_now = -(-now_ms // slot)
        newest = self.short.slot_id[rows].max(axis=1) if rows.size else np.zeros(0, np.int64)
        hi = np.minimum(hi_now, newest + 1)
        lo = hi - self.short.n_slots
        if since_ms is not None:
            lo = np.maximum(lo, -(-np.asarray(since_ms, dtype=np.int64) // slot))
        lo = np.maximum(lo, 0)
        has = newest >= 0
        lag = np.where(has, np.maximum(now_ms - hi * slot, 0), 0).astype(np.float64)
        sums = self.window(rows, lo, hi)
        sums[~has | (lag > max_lag_ms)] = 0.0
        n, mean, var = moments(sums)
        bsums, hours = self.baseline(rows, np.minimum(now_ms, hi * slot), baseline_hours)
        bn, bmean, bvar = moments(bsums)
        return {
            "quality_n_5m": n, "quality_mean_5m": mean, "quality_var_5m": var,
            "base_quality_n": bn, "base_quality_mean": bmean, "base_quality_var": bvar,
            "base_quality_hours": hours, "quality_lag_ms": np.where(has, lag, np.nan),
        }

    # -- snapshot -----------------------------------------------------------
    def state(self) -> dict[str, object]:
        """Arrays + versions for a snapshot (see :meth:`load`)."""
        return {"short": self.short.state(), "base": self.base.state(), "version": list(self.version)}

    def load(self, state: dict[str, object]) -> None:
        """Restore from :meth:`state` (raises ``ValueError`` on a shape mismatch)."""
        self.short.load(state["short"])  # type: ignore[arg-type]
        self.base.load(state["base"])  # type: ignore[arg-type]
        saved = state["version"]
        if not isinstance(saved, list):
            raise ValueError(f"quality state version is {type(saved).__name__}, not a list")
        self.version = list(saved)
        self.version.extend([None] * (self.short.capacity - len(self.version)))
