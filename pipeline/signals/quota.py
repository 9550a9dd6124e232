"""SPEC §4.7 quota drain: forecast the exhaustion of a channel's daily quota before the 429 wall.

Features from :class:`QuotaWindows` (below): Theil–Sen fits (Theil 1950,
Sen 1968) of the reported ``quota_remaining`` over the last 30 min and the
last 10 min of event time, one point per minute, restarted at a refill.

A fit is *judged* with at least ``quota_min_points`` minutes of samples and
counts when its drain is significant (the lower 99 % confidence bound of the
drain > 0). The drain used is the 30 min one, or the 10 min one where that is
significant and faster (a drain that sped up shows within minutes instead of
after half the window). The forecast time to exhaustion is the fit's level
at ``now`` ÷ drain (seconds).

Fires (soft, reason ``quota``) on a judged channel when

- the forecast is within ``quota_horizon_s`` (30 min), or
- the newest minute's share left is below ``quota_low_share`` (5 %), or
- *pre-rate-limit*: the share left is below ``quota_pre_rl_level`` (20 %)
  and the 429 share of the last 5 min is rising: its exact (Clopper-Pearson
  1934) lower bound (99 %) is above the exact upper bound (99 %) of the 25 min
  before; at an unchanged share each bound misses with probability <= 1 %
  at every count, so a steady share rises falsely on <= 1 % of the judged
  rounds whatever the traffic (the Wilson bounds did not hold that at small counts).

Once fired it holds while the channel is judged and the forecast is within
1.5 × the horizon or the share left below 2 × ``quota_low_share``
(hysteresis); a refill restarts the fits, so the finding clears until
``quota_min_points`` new minutes exist. Channels without ``quota_remaining``
have NaN metrics and never fire.

The signal's windows: per-minute ``quota_remaining`` samples and their robust trend (SPEC §4.7).

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

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Params, Signal, ThresholdArrays, param
from pipeline.stats import alpha_for, exact_lower, exact_upper, safe_ratio, theil_sen
from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing
from pipeline.windows.view import WindowView

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
        columns: list[np.ndarray] = [np.empty(0)] * 5  # in column order Q_SUM .. REQ; every entry set below
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

        def take(a: np.ndarray) -> np.ndarray:
            return np.take_along_axis(a, order, axis=1)

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
            slope, icpt, _, s_hi, n = theil_sen(xs, ys, mask, QUOTA_SLOPE_CONFIDENCE)
            out[f"{prefix}points"][live] = n
            out[f"{prefix}drain_per_h"][live] = -3600.0 * slope
            out[f"{prefix}drain_lower_per_h"][live] = -3600.0 * s_hi
            out[f"{prefix}level"][live] = icpt
        return out


@dataclass(frozen=True)
class QuotaParams(Params):
    """Thresholds of ``quota`` (policy table ``[tier.X.quota]``)."""

    #: SPEC §4.7: forecast time to exhaustion (s, > 0) at or under which the channel degrades.
    quota_horizon_s: float = param(1800.0, gt=0)
    #: SPEC §4.7: share of the quota left (0, 1) under which the channel degrades.
    quota_low_share: float = param(0.05, gt=0, lt=1)
    #: Share left (0, 1) under which a rising 429 share counts as pre-rate-limit (SPEC §4.7 seed).
    quota_pre_rl_level: float = param(0.2, gt=0, lt=1)
    #: Minutes with quota samples (2 .. 10, the recent fit's window) a fit needs to be judged.
    quota_min_points: int = param(6, ge=2, le=10, says="in 2 .. 10")


class QuotaDrain:
    """Soft signal ``quota`` (see the module docstring)."""

    reason = "quota"

    def __init__(self, confidence: float = 0.99):
        self.alpha = alpha_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Forecast, low-share and pre-rate-limit rules over arrays (C,); NaN features never fire."""
        min_pts = th.quota_min_points
        judged = np.nan_to_num(view.quota_points) >= min_pts
        sig_long = judged & (np.nan_to_num(view.quota_drain_lower_per_h) > 0)
        sig_recent = ((np.nan_to_num(view.quota_recent_points) >= min_pts)
                      & (np.nan_to_num(view.quota_recent_drain_lower_per_h) > 0))
        recent = sig_recent & judged & (~sig_long | (np.nan_to_num(view.quota_recent_drain_per_h)
                                                     > np.nan_to_num(view.quota_drain_per_h)))
        drain = np.where(recent, view.quota_recent_drain_per_h, np.where(sig_long, view.quota_drain_per_h, np.nan))
        level = np.where(recent, view.quota_recent_level, view.quota_level)
        with np.errstate(invalid="ignore", divide="ignore"):
            exh_s = np.where(drain > 0, np.clip(level, 0.0, None) / drain * 3600.0, np.nan)
        exh_s = np.where(judged, exh_s, np.nan)
        left = np.where(judged, view.quota_remaining, np.nan)
        rl_before = view.quota_rl_30m - view.quota_rl_5m
        req_before = view.quota_req_30m - view.quota_req_5m
        near = judged & (np.nan_to_num(left, nan=1.0) < th.quota_pre_rl_level)  # only these need the bounds
        lo_now = exact_lower(view.quota_rl_5m, view.quota_req_5m, self.alpha, near)
        hi_before = exact_upper(rl_before, req_before, self.alpha, near)
        rising = np.nan_to_num(lo_now) > np.nan_to_num(hi_before, nan=1.0)
        pre_rl = near & rising
        soon = np.nan_to_num(exh_s, nan=np.inf) <= th.quota_horizon_s
        low = np.nan_to_num(left, nan=1.0) < th.quota_low_share
        keep = active & judged & ((np.nan_to_num(exh_s, nan=np.inf) <= 1.5 * th.quota_horizon_s)
                                  | (np.nan_to_num(left, nan=1.0) < 2.0 * th.quota_low_share))
        return Finding(self.reason, soon | low | pre_rl | keep, {
            "quota_remaining": left,
            "quota_drain_per_h": np.where(judged, drain, np.nan),
            "quota_exhaustion_s": exh_s,
            "quota_points": np.nan_to_num(view.quota_points),
            "quota_rate_limited_share_5m": np.where(judged, safe_ratio(view.quota_rl_5m, view.quota_req_5m), np.nan),
            "quota_pre_rate_limit": np.where(judged, pre_rl.astype(np.float64), np.nan),
        })


SIGNAL = Signal(
    name="quota", kind="soft", params=QuotaParams, detector=QuotaDrain(), windows=QuotaWindows,
    features=FEATURES,
    metrics=("quota_remaining", "quota_drain_per_h", "quota_exhaustion_s", "quota_points",
             "quota_rate_limited_share_5m", "quota_pre_rate_limit"),
    examples=Examples(
        firing={"quota_points": 30, "quota_remaining": 0.3, "quota_drain_per_h": 1.2,
                "quota_drain_lower_per_h": 1.0, "quota_level": 0.3},
        thin=({"quota_points": 5, "quota_recent_points": 5, "quota_remaining": 0.01, "quota_level": 0.01,
               "quota_drain_per_h": 5.0, "quota_drain_lower_per_h": 4.0, "quota_recent_drain_per_h": 5.0,
               "quota_recent_drain_lower_per_h": 4.0, "quota_rl_5m": 50, "quota_req_5m": 50,
               "quota_req_30m": 300, "quota_rl_30m": 50},)),
    rule="Theil–Sen drain of `quota_remaining` over 30 min (or 10 min when faster), ≥ 6 minutes of samples: "
         "forecast exhaustion within 30 min, or under 5 % left, or under 20 % left with a rising 429 share",
    default="30 min / 5 % (holds to 45 min / 10 %)",
)
