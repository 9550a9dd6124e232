"""The ``quota`` signal's windows: per-minute ``quota_remaining`` samples and their robust trend (SPEC §4.7).

Per channel, one :class:`~pipeline.windows.ring.IntervalRing` of
:data:`QUOTA_SLOTS` one-minute slots of event time holds five float32
counters per minute: the sum and count of the reported ``quota_remaining``
(share of the daily quota left, [0, 1]), the sum of those samples' offsets
into the minute (s), the 429 (``rate_limited``) answers and the requests
counted (events with a quota sample or a 429). A minute's point is the mean
quota at the mean sample time. Only events with a quota sample or a 429
are written, so a channel that sends neither costs its ``slot_id`` row
only: 32 × 8 = 256 bytes; a quota channel adds 32 × 5 × 4 = 640 bytes
(896 bytes per busy channel).

Features (float64, shape (len(rows),), NaN where the channel has no
quota sample in the window):

- the 30 min fit: ``quota_points`` (minutes with a sample, 0 without),
  ``quota_drain_per_h`` (minus the Theil–Sen slope, share per hour; > 0 =
  draining), ``quota_drain_lower_per_h`` (its lower 99 % confidence bound,
  Sen 1968), ``quota_level`` (the fitted share left at ``now``);
- the same over the last 10 min (``quota_recent_*``), which sees a drain
  that sped up (a batch job) before it dominates the 30 min median;
- ``quota_remaining``: the newest minute's mean;
- ``quota_rl_5m`` / ``quota_req_5m`` and ``quota_rl_30m`` / ``quota_req_30m``:
  429s and counted requests of the last 5 and 30 min.

A daily refill shows as a jump up between consecutive minutes of more than
:data:`QUOTA_RESET_JUMP`: both fits start at the newest such jump, so a
finding on the drained quota clears. ``since_ms`` (state entry) is not
applied: the quota drains whatever the channel's state.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri

from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing

#: One slot per minute of event time (SPEC §4.7: a fit over 30 min of samples).
QUOTA_SLOT_MS = 60_000
#: Ring length: the 30 min window (30 slots, the current partial minute included) plus margin.
QUOTA_SLOTS = 32
#: The long fit's window, ms (SPEC §4.7).
QUOTA_FIT_MS = 1_800_000
#: The recent fit's window, ms: a third of the long one.
QUOTA_RECENT_MS = 600_000
#: A rise of more than this share between consecutive minutes is a quota reset (daily refill);
#: a quota only falls between refills, so reporting jitter of a few % never reaches it.
QUOTA_RESET_JUMP = 0.1
#: Two-sided confidence of the slope interval (Sen 1968, as ``scipy.stats.theilslopes``' ``alpha``).
QUOTA_SLOPE_CONFIDENCE = 0.99
#: Columns of the ring's counters.
Q_SUM, Q_N, T_SUM, RL, REQ = range(5)

FEATURES: tuple[str, ...] = (
    "quota_remaining", "quota_points", "quota_drain_per_h", "quota_drain_lower_per_h", "quota_level",
    "quota_recent_points", "quota_recent_drain_per_h", "quota_recent_drain_lower_per_h", "quota_recent_level",
    "quota_rl_5m", "quota_req_5m", "quota_rl_30m", "quota_req_30m",
)


def _order_stat(sorted_vals: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``sorted_vals[r, k[r]]`` per row (``k`` clipped into range)."""
    k = np.clip(k, 0, sorted_vals.shape[1] - 1).astype(np.int64)
    return np.take_along_axis(sorted_vals, k[:, None], axis=1)[:, 0]


def _median_sorted(sorted_vals: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Median of the first ``m`` (int (R,)) values of each sorted row; NaN where ``m`` is 0."""
    med = 0.5 * (_order_stat(sorted_vals, (m - 1) // 2) + _order_stat(sorted_vals, m // 2))
    return np.where(m > 0, med, np.nan)


def theil_sen(x: np.ndarray, y: np.ndarray, keep: np.ndarray,
              confidence: float = QUOTA_SLOPE_CONFIDENCE) -> tuple[np.ndarray, ...]:
    """Theil–Sen fits of ``y`` on ``x``, one per row, over the points where ``keep``.

    ``x``, ``y`` float64 (R, S) (``x`` distinct within a row where kept),
    ``keep`` bool (R, S). Returns ``(slope, intercept, slope_lo, slope_hi,
    n)``, each (R,): the median of the pairwise slopes (Theil 1950, Sen 1968),
    the median of ``y - slope * x`` (the intercept at ``x = 0``, as
    ``scipy.stats.theilslopes``), the ``confidence`` two-sided interval of the
    slope from the normal approximation of Kendall's S (Sen 1968; the ranks
    of ``scipy.stats.theilslopes``, without its tie correction, so never
    narrower) and the number of points. NaN where fewer than 2 points.
    ``confidence`` in (0, 1), else ``ValueError``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    r, s = x.shape
    n = keep.sum(axis=1)
    iu, ju = np.triu_indices(s, 1)
    pair = keep[:, iu] & keep[:, ju]
    with np.errstate(invalid="ignore", divide="ignore"):
        slopes = np.where(pair, (y[:, ju] - y[:, iu]) / (x[:, ju] - x[:, iu]), np.nan)
    slopes.sort(axis=1)  # NaN last
    m = pair.sum(axis=1)
    slope = _median_sorted(slopes, m)
    z = float(ndtri(0.5 + confidence / 2.0))
    half = z * np.sqrt(n * (n - 1.0) * (2.0 * n + 5.0) / 18.0)
    hi = _order_stat(slopes, np.minimum(np.round((m + half) / 2.0), m - 1))
    lo = _order_stat(slopes, np.maximum(np.round((m - half) / 2.0) - 1, 0))
    resid = np.where(keep, y - np.nan_to_num(slope)[:, None] * x, np.nan)
    resid.sort(axis=1)
    icpt = _median_sorted(resid, n)
    none = n < 2
    return (np.where(none, np.nan, slope), np.where(none, np.nan, icpt), np.where(none, np.nan, lo),
            np.where(none, np.nan, hi), n.astype(np.float64))


class QuotaWindows(RingWindows):
    """Per-minute quota samples and 429 counts of every channel (see the module docstring)."""

    name = "quota"
    columns = ("quota_remaining",)

    def __init__(self, spec: WindowSpec):
        self.rings = {"minute": IntervalRing(QUOTA_SLOT_MS, QUOTA_SLOTS, 5, 0)}

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """Count the events with a quota sample or a 429 (``late`` is not used: the ring keeps 32 min)."""
        q = cols.column("quota_remaining")
        has = ~np.isnan(q)
        sel = has | cols.rate_limited
        if not sel.any():
            return
        q, has, ts = q[sel], has[sel], cols.ts_ms[sel]
        columns = [None] * 5  # in column order Q_SUM .. REQ
        columns[Q_SUM] = np.where(has, np.clip(q, 0.0, 1.0), 0.0)
        columns[Q_N] = has
        columns[T_SUM] = np.where(has, (ts % QUOTA_SLOT_MS) / 1000.0, 0.0)
        columns[RL] = cols.rate_limited[sel]
        columns[REQ] = np.ones(q.shape[0], bool)
        self.rings["minute"].add(cols.channel[sel], ts, columns)

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        """The fits and counts at event time ``now_ms`` (see the module docstring); ``since_ms`` unused."""
        ring = self.rings["minute"]
        rows = np.asarray(rows, dtype=np.int64)
        out = {k: np.full(rows.shape[0], np.nan) for k in FEATURES}
        for k in ("quota_points", "quota_recent_points", "quota_rl_5m", "quota_req_5m", "quota_rl_30m",
                  "quota_req_30m"):
            out[k][:] = 0.0
        if rows.shape[0] == 0:
            return out
        hi = -(-int(now_ms) // QUOTA_SLOT_MS)
        ids = ring.slot_id[rows]
        in30 = (ids >= -(-(int(now_ms) - QUOTA_FIT_MS) // QUOTA_SLOT_MS)) & (ids < hi)
        live = np.nonzero(in30.any(axis=1))[0]  # channels with anything in the window: the rest stay empty
        if live.size == 0:
            return out
        ids, in30 = ids[live], in30[live]
        counts = ring.counts[rows[live]].astype(np.float64)
        in5 = in30 & (ids >= -(-(int(now_ms) - 300_000) // QUOTA_SLOT_MS))
        for key, mask, col in (("quota_rl_5m", in5, RL), ("quota_req_5m", in5, REQ),
                               ("quota_rl_30m", in30, RL), ("quota_req_30m", in30, REQ)):
            out[key][live] = (counts[:, :, col] * mask).sum(axis=1)
        # the fits: only channels with a quota sample in the window (the others, 429s only, keep NaN / 0)
        valid = in30 & (counts[:, :, Q_N] > 0)
        sampled = np.flatnonzero(valid.any(axis=1))
        if sampled.shape[0] == 0:
            return out
        if sampled.shape[0] < live.shape[0]:
            live, ids, counts, valid = live[sampled], ids[sampled], counts[sampled], valid[sampled]
        # points in time order: empty slots first (key -1), then by minute
        order = np.argsort(np.where(valid, ids, -1), axis=1, kind="stable")
        take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
        valid, ids = take(valid), take(ids)
        qn = np.where(valid, take(counts[:, :, Q_N]), 1.0)
        y = np.where(valid, take(counts[:, :, Q_SUM]) / qn, np.nan)
        x_s = np.where(valid, ids * (QUOTA_SLOT_MS / 1000.0) + take(counts[:, :, T_SUM]) / qn - now_ms / 1000.0,
                       np.nan)
        # a refill: keep the points from the newest jump up on
        jump = np.zeros(valid.shape, bool)
        jump[:, 1:] = valid[:, 1:] & valid[:, :-1] & (np.nan_to_num(y[:, 1:] - y[:, :-1]) > QUOTA_RESET_JUMP)
        pos = np.arange(valid.shape[1])
        start = np.where(jump, pos, 0).max(axis=1)
        keep = valid & (pos >= start[:, None])
        has = keep.any(axis=1)
        out["quota_remaining"][live] = np.where(has, y[:, -1], np.nan)
        recent = keep & (ids >= -(-(int(now_ms) - QUOTA_RECENT_MS) // QUOTA_SLOT_MS))
        x_s, y = np.nan_to_num(x_s), np.nan_to_num(y)
        r = QUOTA_RECENT_MS // QUOTA_SLOT_MS + 1  # the recent points are among the newest 11 (time order)
        for prefix, (xs, ys, mask) in (("quota_", (x_s, y, keep)),
                                       ("quota_recent_", (x_s[:, -r:], y[:, -r:], recent[:, -r:]))):
            slope, icpt, _, s_hi, n = theil_sen(xs, ys, mask)
            out[f"{prefix}points"][live] = n
            out[f"{prefix}drain_per_h"][live] = -3600.0 * slope
            out[f"{prefix}drain_lower_per_h"][live] = -3600.0 * s_hi
            out[f"{prefix}level"][live] = icpt
        return out
