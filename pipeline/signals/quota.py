"""SPEC §4.7 quota drain: forecast the exhaustion of a channel's daily quota before the 429 wall.

Features from :mod:`pipeline.windows.quota`: Theil–Sen fits (Theil 1950,
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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Signal, ThresholdArrays
from pipeline.stats import alpha_for, exact_lower, exact_upper, safe_ratio
from pipeline.windows.quota import FEATURES, QuotaWindows
from pipeline.windows.view import WindowView


@dataclass(frozen=True)
class QuotaParams:
    """Thresholds of ``quota`` (policy table ``[tier.X.quota]``)."""

    #: SPEC §4.7: forecast time to exhaustion (s, > 0) at or under which the channel degrades.
    quota_horizon_s: float = 1800.0
    #: SPEC §4.7: share of the quota left (0, 1) under which the channel degrades.
    quota_low_share: float = 0.05
    #: Share left (0, 1) under which a rising 429 share counts as pre-rate-limit (SPEC §4.7 seed).
    quota_pre_rl_level: float = 0.2
    #: Minutes with quota samples (2 .. 10, the recent fit's window) a fit needs to be judged.
    quota_min_points: int = 6

    def __post_init__(self) -> None:
        if not self.quota_horizon_s > 0.0:
            raise ValueError(f"quota_horizon_s must be > 0, got {self.quota_horizon_s}")
        if not 0.0 < self.quota_low_share < 1.0:
            raise ValueError(f"quota_low_share must be in (0, 1), got {self.quota_low_share}")
        if not 0.0 < self.quota_pre_rl_level < 1.0:
            raise ValueError(f"quota_pre_rl_level must be in (0, 1), got {self.quota_pre_rl_level}")
        if not 2 <= self.quota_min_points <= 10:
            raise ValueError(f"quota_min_points must be in 2 .. 10, got {self.quota_min_points}")


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
