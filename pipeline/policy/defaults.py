"""Every default number of the detection policy, with its SPEC section.

:class:`PolicyConfig` is frozen; :func:`load_policy` reads overrides per tier
and per channel from a TOML file (``[tier.free]``, ``[channel."name"]``
tables). Unknown keys and out-of-range values are errors, never ignored.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Thresholds:
    """Per-tier / per-channel detector thresholds.

    Error rates and missing rates are fractions in [0, 1]; ratios are
    dimensionless; counts are requests.
    """

    #: SPEC §4.1: trip line 0.5 % for paid channels (0.35 % for free, below).
    error_rate_trip: float = 0.005
    #: SPEC §4.1: minimum requests in a window before the error-rate test applies.
    error_min_requests: int = 30
    #: Minimum failures in a window before it may trip: keeps the 1 min window
    #: quiet on clean days (at 0.2 % and 10 req/s, P(>= 8 failures in 1 min)
    #: is about 1e-5).
    error_min_failures: int = 8
    #: SPEC §4.2: a run of this many consecutive failures pre-trips the channel.
    consecutive_failures: int = 5
    #: SPEC §4.3: P95(5 min) / P95(24 h baseline) that degrades the channel ...
    latency_ratio_trip: float = 1.8
    #: ... and the ratio at or below which the finding clears (hysteresis).
    latency_ratio_clear: float = 1.2
    #: Minimum successful requests in the 5 min window for a P95.
    latency_min_requests: int = 50
    #: Minimum successful requests in the 24 h baseline.
    baseline_min_requests: int = 500
    #: Minimum whole hours of history before the baseline is trusted.
    baseline_min_hours: int = 1
    #: SPEC §4.4: share of checked ``ok`` answers missing a field that degrades.
    missing_rate_trip: float = 0.01
    #: Minimum checked ``ok`` answers in 5 min.
    missing_min_checked: int = 50
    #: SPEC §4 half_open → recovering if the probe error rate stayed below this.
    half_open_max_error_rate: float = 0.003
    #: SPEC §4.5: drop of the 5 min mean quality score below the channel's
    #: baseline mean (score units, P(good answer) in [0, 1]) that may degrade
    #: the channel (the Welch test must also be significant) ...
    quality_min_drop: float = 0.10
    #: ... and the drop at or below which the finding clears (hysteresis).
    quality_clear_drop: float = 0.05
    #: Minimum scored samples in the 5 min window (at the default sampling of
    #: one per 2 s per channel a window holds up to 150).
    quality_min_samples: int = 20
    #: Minimum scored samples in the quality baseline (24 complete hours).
    quality_baseline_min_samples: int = 100
    #: Minimum whole hours with scores before the quality baseline is trusted.
    quality_baseline_min_hours: int = 1

    def __post_init__(self) -> None:
        for name in ("error_rate_trip", "missing_rate_trip", "half_open_max_error_rate"):
            v = getattr(self, name)
            if not 0.0 < v < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {v}")
        if not 1.0 <= self.latency_ratio_clear < self.latency_ratio_trip:
            raise ValueError("need 1 <= latency_ratio_clear < latency_ratio_trip")
        if not 0.0 <= self.quality_clear_drop < self.quality_min_drop <= 1.0:
            raise ValueError("need 0 <= quality_clear_drop < quality_min_drop <= 1")
        for name in ("error_min_requests", "error_min_failures", "consecutive_failures", "latency_min_requests",
                     "baseline_min_requests", "missing_min_checked", "quality_min_samples",
                     "quality_baseline_min_samples", "quality_baseline_min_hours"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.consecutive_failures > 100:
            raise ValueError("consecutive_failures must be <= 100 (the run window, SPEC §4.2)")


#: SPEC §4.1: free channels have a lower baseline error rate, so their line is 0.35 %.
FREE_TIER = Thresholds(error_rate_trip=0.0035)
PAID_TIER = Thresholds()


@dataclass(frozen=True)
class PolicyConfig:
    """Timing, statistics and weight-shaping numbers (SPEC §4).

    Times are event-time milliseconds.
    """

    tiers: Mapping[str, Thresholds] = field(default_factory=lambda: {"free": FREE_TIER, "paid": PAID_TIER})
    channels: Mapping[str, Thresholds] = field(default_factory=dict)
    #: Tier assumed for events that carry none.
    default_tier: str = "paid"
    #: One-sided confidence of the Wilson lower bound used by the rate tests
    #: (z = 3.72): at this level a healthy channel at 60 % of its trip line
    #: trips on fewer than 1 in 10,000 windows (SPEC §4.1: "1 failure in 20
    #: requests at 3 a.m. does not trip").
    rate_confidence: float = 0.9999
    #: SPEC §4: re-evaluate every active channel at least every 30 s of event time.
    eval_interval_ms: int = 30_000
    #: SPEC §4.1 short windows.
    short_window_ms: int = 60_000
    window_ms: int = 300_000
    #: SPEC §4.3 rolling baseline.
    baseline_window_ms: int = 24 * 3_600_000
    #: SPEC §4: open → half_open cooldown, and the half-open observation time.
    open_cooldown_ms: int = 90_000
    half_open_observe_ms: int = 90_000
    half_open_weight: float = 0.05
    #: SPEC §4: "any failure run sends it back to open": run length that
    #: re-opens a channel while it is probing in ``half_open``.
    half_open_failure_run: int = 2
    #: SPEC §4 recovering ramp: +0.10 every 120 s up to 0.40, then +0.20 steps.
    ramp_interval_ms: int = 120_000
    ramp_small_step: float = 0.10
    ramp_small_until: float = 0.40
    ramp_large_step: float = 0.20
    #: SPEC §4: a degraded channel's weight falls by at most this per round.
    max_weight_cut_per_round: float = 0.15
    #: Floor of a degraded channel's weight (soft signals never take all traffic).
    degraded_floor_weight: float = 0.5
    #: Weight regained per round once the soft signals cleared.
    degraded_recovery_step: float = 0.15
    #: SPEC §4 penalties: half-life of the penalty score, cost of one failure,
    #: cost of a tripping run; the healthy weight is 1 - min(penalty, max_penalty).
    penalty_half_life_ms: int = 300_000
    penalty_per_failure: float = 0.002
    penalty_per_run: float = 0.3
    max_penalty: float = 0.3
    #: SPEC §4 bounded shifts: a channel's share of its route grows by at most
    #: this factor per round (unless nothing else can take the traffic).
    max_share_growth: float = 1.5
    #: SPEC §4: no events for this long (event time) → ``no_data``.
    no_data_after_ms: int = 300_000
    #: SPEC §4: ``no_data`` is published on the transition, then again every this long
    #: (event time) while the channel stays idle and in memory; 0: only on the transition.
    no_data_heartbeat_ms: int = 600_000
    #: Events older than the watermark minus this are late: counted and dead-lettered.
    allowed_lateness_ms: int = 120_000
    #: SPEC §4 half_open → recovering "or below the channel's own pre-incident
    #: baseline rate (an upper confidence bound)": one-sided confidence of the
    #: probe's lower and the baseline's upper Wilson bound
    #: (:func:`pipeline.policy.probe.probe_passes` gives the error rates).
    probe_confidence: float = 0.99

    def __post_init__(self) -> None:
        if not 0.5 < self.probe_confidence < 1.0:
            raise ValueError(f"probe_confidence must be in (0.5, 1), got {self.probe_confidence}")

    def thresholds(self, channel: str, tier: str | None) -> Thresholds:
        """Thresholds for a channel: the channel override, else its tier's."""
        if channel in self.channels:
            return self.channels[channel]
        return self.tiers.get(tier or self.default_tier, self.tiers[self.default_tier])


def _thresholds_from(base: Thresholds, table: Mapping[str, Any], where: str) -> Thresholds:
    known = {f.name for f in dataclasses.fields(Thresholds)}
    unknown = set(table) - known
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; valid keys: {sorted(known)}")
    return dataclasses.replace(base, **table)


def load_policy(path: str | Path | None = None) -> PolicyConfig:
    """Load :class:`PolicyConfig` with overrides from a TOML file.

    File layout::

        [policy]                 # PolicyConfig fields (numbers)
        eval_interval_ms = 30000
        [tier.free]              # Thresholds fields
        error_rate_trip = 0.0035
        [channel."lepton/llama-70b@free"]
        consecutive_failures = 3

    Raises ``ValueError`` (unknown key, bad value) or ``OSError``.
    """
    base = PolicyConfig()
    if path is None:
        return base
    data = tomllib.loads(Path(path).read_text())
    tiers = dict(base.tiers)
    for tier, table in data.get("tier", {}).items():
        tiers[tier] = _thresholds_from(tiers.get(tier, PAID_TIER), table, f"[tier.{tier}]")
    channels = {}
    for name, table in data.get("channel", {}).items():
        tier = table.pop("tier", None)
        channels[name] = _thresholds_from(tiers.get(tier or base.default_tier, PAID_TIER), table, f'[channel."{name}"]')
    top = data.get("policy", {})
    known = {f.name for f in dataclasses.fields(PolicyConfig)} - {"tiers", "channels"}
    unknown = set(top) - known
    if unknown:
        raise ValueError(f"[policy]: unknown keys {sorted(unknown)}")
    return dataclasses.replace(base, tiers=tiers, channels=channels, **top)
