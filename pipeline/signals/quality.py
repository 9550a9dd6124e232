"""SPEC §4.5 answer quality: the 5 min mean score vs the channel's own baseline.

Scores are P(good answer) in [0, 1] from the embedding quality model
(:mod:`pipeline.quality`), for a rate-limited sample of each channel's
``ok`` responses (:mod:`pipeline.quality.sampler`). Per channel:

- window: the scores of the last 5 min (``n5``, mean ``m5``, sample variance ``v5``);
- baseline: the scores of the 24 complete hours before the current hour
  (``nb``, ``mb``, ``vb``), the same rolling baseline as latency (SPEC §4.3).

**Test** (one-sided Welch t-test, H1: the window mean is below the baseline mean)::

    drop = mb - m5
    t    = drop / sqrt(v5 / n5 + vb / nb)
    df   = (v5/n5 + vb/nb)^2 / ((v5/n5)^2 / (n5-1) + (vb/nb)^2 / (nb-1))   (Welch–Satterthwaite)

The finding **fires** when ``n5 >= quality_min_samples`` (20),
``nb >= quality_baseline_min_samples`` (100), the baseline spans
``>= quality_baseline_min_hours`` (1) hours, ``t >= t_{df}(confidence)``
(one-sided, default confidence 99.999 %: p <= 1e-5 per round) **and**
``drop >= quality_min_drop`` (0.10 score units: a minimum effect size, so
a busy channel with a statistically significant but harmless 0.02 dip does
not degrade). Because the window is 5 min of samples, a fired finding is a
*sustained* drop: at the default sampling (1 sample / 2 s / channel) it
needs the mean of up to ~150 answers to fall by 0.10.

Why 1e-5 and not the rate tests' 1e-4: a channel is judged every 30 s on
overlapping windows, ~300 independent 5 min windows a day; at 1e-4 a clean
channel would see a false ``quality`` alarm on roughly 3 % of days, at 1e-5
on about 0.3 % (normal approximation). On three simulated clean days
(4 channels x 26 h each, up to ~150 samples per window, fewer at night) the
largest t reached 0.72-0.81 of the critical value.
The price is detection time: with ~140 samples per window the 5 min mean
must fall by ~0.15 (not 0.12) before t crosses ~4.4.

It **clears** when the drop is back at or below ``quality_clear_drop``
(0.05) with enough samples (hysteresis, like latency's 1.8 / 1.2). With
some samples in the window but too few to judge, the previous finding is
kept; with no samples at all, or no usable baseline (e.g. right after a new
model version reset the channel's scores), it is dropped: there is nothing
left that shows a drop.

Scoring lags event time, so the window is each channel's latest 5 scored
minutes (:meth:`pipeline.windows.quality.QualityWindows.aggregates`);
``quality_lag_s`` says how far it ends behind the round's time.

Metrics: ``quality_score_5m`` (window mean), ``quality_baseline``
(baseline mean), ``quality_drop``, ``quality_t``, ``quality_samples_5m``,
``quality_baseline_samples``, ``quality_lag_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
from scipy.special import stdtrit  # Student t quantile (what scipy.stats.t.ppf calls), without scipy.stats

from pipeline.signals.base import Examples, Finding, Order, Params, Signal, ThresholdArrays, param
from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.quality import QualityWindows
from pipeline.windows.view import WindowView

#: The short ring's slot (10 s, the counters' grid) and the baseline's (1 h, SPEC §4.3 / §4.5).
SLOT_MS = 10_000
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class QualityParams(Params):
    """Thresholds of ``quality`` (policy table ``[tier.X.quality]``); scores are P(good answer) in [0, 1]."""

    #: SPEC §4.5: drop of the 5 min mean score below the channel's baseline mean (score units)
    #: that may degrade the channel (the Welch test must also be significant) ...
    quality_min_drop: float = 0.10
    #: ... and the drop at or below which the finding clears (hysteresis; 0 <= clear < min_drop <= 1).
    quality_clear_drop: float = 0.05
    #: Minimum scored samples in the 5 min window (>= 1; at the default sampling of one per 2 s per
    #: channel a window holds up to 150).
    quality_min_samples: int = param(20, ge=1)
    #: Minimum scored samples in the quality baseline (24 complete hours; >= 1).
    quality_baseline_min_samples: int = param(100, ge=1)
    #: Minimum whole hours with scores before the quality baseline is trusted (>= 1).
    quality_baseline_min_hours: int = param(1, ge=1)

    ORDER = (Order("quality_clear_drop", "quality_min_drop", floor=0, ceiling=1),)


def _finite(x: np.ndarray) -> np.ndarray:
    """float64 copy of ``x`` with NaN/inf as 0 (counts)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), x, 0.0)


class QualityDrop:
    """Soft signal ``quality`` (degrades)."""

    reason = "quality"

    def __init__(self, confidence: float = 0.99999):
        if not 0.5 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
        self.confidence = confidence

    def welch(self, view: WindowView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(drop, t, df)`` per channel (NaN where not computable, i.e. fewer than 2
        samples on either side or non-finite inputs); no warnings."""
        n5 = _finite(view.quality_n_5m)
        nb = _finite(view.base_quality_n)
        m5 = np.asarray(view.quality_mean_5m, dtype=np.float64)
        mb = np.asarray(view.base_quality_mean, dtype=np.float64)
        v5 = np.asarray(view.quality_var_5m, dtype=np.float64)
        vb = np.asarray(view.base_quality_var, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            drop = mb - m5
            ok = (n5 >= 2) & (nb >= 2) & np.isfinite(drop) & np.isfinite(v5) & np.isfinite(vb)
            if not ok.any():
                nan = np.full(drop.shape, np.nan)
                return nan, nan.copy(), nan.copy()
            n5s, nbs = np.where(ok, n5, 2.0), np.where(ok, nb, 2.0)
            a = np.where(ok, np.maximum(v5, 0.0), 1.0) / n5s
            b = np.where(ok, np.maximum(vb, 0.0), 1.0) / nbs
            d = np.where(ok, drop, 0.0)
            se2 = a + b
            pos = se2 > 0
            t = np.where(pos, d / np.sqrt(np.where(pos, se2, 1.0)), np.where(d > 0, np.inf, 0.0))
            den = a * a / (n5s - 1.0) + b * b / (nbs - 1.0)
            df = np.where(den > 0, se2 * se2 / np.where(den > 0, den, 1.0), n5s + nbs - 2.0)
        return np.where(ok, drop, np.nan), np.where(ok, t, np.nan), np.where(ok, np.maximum(df, 1.0), np.nan)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Trip on a significant drop of at least ``quality_min_drop``; clear at ``quality_clear_drop``."""
        drop, t, df = self.welch(view)
        n5 = _finite(view.quality_n_5m)
        nb = _finite(view.base_quality_n)
        base_ok = (nb >= th.quality_baseline_min_samples) & (_finite(view.base_quality_hours)
                                                             >= th.quality_baseline_min_hours)
        finite = np.isfinite(drop)
        valid = (n5 >= th.quality_min_samples) & base_ok & finite
        d = np.where(finite, drop, 0.0)
        candidate = valid & ~active & (d >= th.quality_min_drop)
        trip = np.zeros(d.shape, bool)
        if candidate.any():  # the t quantile only where the effect size is already there
            crit = stdtrit(df[candidate], self.confidence)
            trip[candidate] = t[candidate] >= crit
        rule = np.where(active, d > th.quality_clear_drop, trip)
        keep = active & (n5 > 0) & base_ok  # some evidence, too little to judge: keep the finding
        fired = np.where(valid, rule, keep).astype(bool)
        return Finding(self.reason, fired, {
            "quality_score_5m": np.asarray(view.quality_mean_5m, dtype=np.float64),
            "quality_baseline": np.asarray(view.base_quality_mean, dtype=np.float64),
            "quality_drop": drop,
            "quality_t": t,
            "quality_samples_5m": n5,
            "quality_baseline_samples": nb,
            "quality_lag_s": np.asarray(view.quality_lag_ms, dtype=np.float64) / 1000.0,
        })



class QualityScoreWindows(RingWindows):
    """The signal's windows: :class:`~pipeline.windows.quality.QualityWindows` (``rings``: 30 × 10 s and
    ``baseline_hours + 1`` × 1 h of score count / sum / sum of squares, and per channel the model
    version of the scores held).

    Scores arrive apart from their events (:meth:`add_scores`, from
    :class:`pipeline.engine.quality_scores.QualityScores`); :meth:`add` of events does nothing. A row
    moves as the four ring arrays (``short.slot_id`` / ``.counts``, ``base.slot_id`` / ``.counts``) and,
    when the channel holds scores of a version, ``model``: a 0-d str array.
    """

    name = "quality"

    def __init__(self, spec: WindowSpec):
        self.baseline_hours = spec.baseline_hours
        self.scores = QualityWindows(SLOT_MS, spec.window_ms // SLOT_MS, HOUR_MS, spec.baseline_hours + 1)
        self.rings = {"short": self.scores.short, "base": self.scores.base}

    def ensure_capacity(self, n_channels: int) -> None:
        self.scores.ensure_capacity(n_channels)

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """Events carry no scores: nothing to count."""

    def add_scores(self, channel: np.ndarray, ts_ms: np.ndarray, scores: np.ndarray,
                   version: str | None = None) -> tuple[np.ndarray, list[int]]:
        """:meth:`QualityWindows.add <pipeline.windows.quality.QualityWindows.add>`: scores in [0, 1] of
        channel rows ``channel`` at ``ts_ms``; returns ``(too_old, reset_rows)``."""
        return self.scores.add(channel, ts_ms, scores, version)

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        """The ``quality_*`` / ``base_quality_*`` features (:meth:`QualityWindows.aggregates
        <pipeline.windows.quality.QualityWindows.aggregates>`)."""
        return self.scores.aggregates(rows, now_ms, since_ms, self.baseline_hours)

    def export_row(self, i: int) -> dict[str, np.ndarray]:
        out = super().export_row(i)
        version = self.scores.version[i]
        if version is not None:
            out["model"] = np.array(version)
        return out

    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        """Load a row (None: empty, no version); raises ``ValueError`` for a ring array of another shape."""
        super().import_row(i, arrays)
        model = None if arrays is None else arrays.get("model")
        self.scores.version[i] = None if model is None else str(model)


_Q_BASE = {"base_quality_n": 10_000, "base_quality_mean": 0.9, "base_quality_var": 0.01, "base_quality_hours": 24}
SIGNAL = Signal(
    name="quality", kind="soft", params=QualityParams, detector=QualityDrop(), windows=QualityScoreWindows,
    features=("quality_n_5m", "quality_mean_5m", "quality_var_5m", "base_quality_n", "base_quality_mean",
              "base_quality_var", "base_quality_hours", "quality_lag_ms"),
    metrics=("quality_score_5m", "quality_baseline", "quality_drop", "quality_t", "quality_samples_5m",
             "quality_baseline_samples", "quality_lag_s"),
    examples=Examples(
        firing={"quality_n_5m": 150, "quality_mean_5m": 0.55, "quality_var_5m": 0.09, "base_quality_n": 10_000,
                "base_quality_mean": 0.8, "base_quality_var": 0.06, "base_quality_hours": 24},
        thin=({**_Q_BASE, "quality_n_5m": 19, "quality_mean_5m": 0.2, "quality_var_5m": 0.01},
              {**_Q_BASE, "quality_n_5m": 150, "quality_mean_5m": 0.2, "quality_var_5m": 0.01, "base_quality_n": 99},
              {**_Q_BASE, "quality_n_5m": 150, "quality_mean_5m": 0.2, "quality_var_5m": 0.01,
               "base_quality_hours": 0})),
    rule="one-sided Welch t-test (p ≤ 1e-5) of the 5 min mean answer-quality score against the channel's own "
         "24 h baseline, with a minimum drop",
    default="drop ≥ 0.10 (clears at ≤ 0.05)",
)
