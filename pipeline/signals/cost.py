"""SPEC §4.8 cost per unit: the 10 min cost per output token (per request without tokens) vs the 24 h baseline.

Windows: :class:`~pipeline.windows.cost.CostWindows` (10 min of 30 s slots
and 24 complete hours of hourly sums, ~2 KB per channel that sends
``cost_usd``; channels that never send it are never judged and cost nothing).

Test, per channel, on the log of each request's unit cost (``m`` / ``s²`` /
``n``: mean, sample variance and count over 10 min; ``mb`` / ``sb²`` /
``nb``: the same over the baseline; a two-sample z test for large samples,
e.g. Wasserman, *All of Statistics*, 2004, §10.1)::

    cost_ratio = exp(m - mb)                      (ratio of geometric means: the typical request)
    cost_z     = (m - mb) / sqrt(s²/n + sb²/nb)

The finding **fires** when the window holds ``>= cost_min_requests`` (100)
costed requests, the baseline ``>= cost_baseline_min_requests`` (1,000) over
``>= cost_baseline_min_hours`` (1) hours, ``cost_ratio >= cost_ratio_trip``
(1.2: SPEC §4.8 "+20 %") **and** ``cost_z >= z(0.99999)`` (4.26): the
effect-size gate keeps a busy channel's harmless 5 % drift (prompt mix by
time of day) quiet, the z gate keeps thin windows quiet. A uniform price
change moves the geometric and the arithmetic cost per unit alike; the
metrics also show the plain cost per unit (ratio of sums). A 10 min window
makes a fired finding a *sustained* rise: a +30 % step crosses 1.2 once two
thirds of the window hold the new price (~7 min). It **clears** at
``cost_ratio <= cost_ratio_clear`` (1.1; hysteresis). With costed requests
in the window but too few to judge, the previous finding is kept; with none
(or no usable baseline) it is dropped.

**Advisory** (``Signal.kind = "advisory"``): the reason ``cost`` is
published in verdicts while the finding holds, whatever the state, but the
state and weight do not change, unless the channel's policy sets
``cost_degrades = true``: then it degrades like a soft signal.

Metrics: ``cost_per_token_usd`` / ``cost_baseline_per_token_usd`` (NaN when
the unit is the request), ``cost_per_request_usd`` /
``cost_baseline_per_request_usd`` (NaN when the unit is the token),
``cost_ratio``, ``cost_z``, ``cost_requests_10m``,
``cost_baseline_requests`` (requests with ``cost_usd > 0``; zero-priced
requests are not judged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Signal, ThresholdArrays
from pipeline.stats import z_for
from pipeline.windows.cost import CostWindows
from pipeline.windows.view import WindowView


@dataclass(frozen=True)
class CostParams:
    """Thresholds of ``cost`` (policy table ``[tier.X.cost]``)."""

    #: SPEC §4.8: cost per unit (10 min) / baseline cost per unit (24 h) that reports ``cost``
    #: (dimensionless, > clear; "+20 %") ...
    cost_ratio_trip: float = 1.2
    #: ... and the ratio at or below which the finding clears (hysteresis; >= 1).
    cost_ratio_clear: float = 1.1
    #: Minimum costed requests in the 10 min window (>= 1).
    cost_min_requests: int = 100
    #: Minimum costed requests in the 24 h baseline (>= 1).
    cost_baseline_min_requests: int = 1_000
    #: Minimum whole hours with cost in the baseline (>= 1).
    cost_baseline_min_hours: int = 1
    #: SPEC §4.8 "does not lower the weight unless configured": true → the finding degrades
    #: the channel like a soft signal; false (default) → reported only (bool).
    cost_degrades: bool = False

    def __post_init__(self) -> None:
        if not 1.0 <= self.cost_ratio_clear < self.cost_ratio_trip:
            raise ValueError(f"need 1 <= cost_ratio_clear < cost_ratio_trip, got "
                             f"{self.cost_ratio_clear} and {self.cost_ratio_trip}")
        for name in ("cost_min_requests", "cost_baseline_min_requests", "cost_baseline_min_hours"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.cost_degrades, (bool, np.bool_)):
            raise ValueError(f"cost_degrades must be true or false, got {self.cost_degrades!r}")


def _count(x: np.ndarray) -> np.ndarray:
    """float64 copy of ``x`` with NaN/inf as 0 (counts)."""
    x = np.asarray(x, dtype=np.float64)
    return np.where(np.isfinite(x), x, 0.0)


class CostRise:
    """Advisory signal ``cost`` (reported; degrades only with ``cost_degrades``)."""

    reason = "cost"

    def __init__(self, confidence: float = 0.99999):
        self.z = z_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Trip on a significant rise of at least ``cost_ratio_trip``; clear at ``cost_ratio_clear``."""
        m = np.asarray(view.cost_log_mean_10m, np.float64)
        mb = np.asarray(view.base_cost_log_mean, np.float64)
        n, nb = _count(view.cost_n_10m), _count(view.base_cost_n)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d = m - mb
            se2 = (np.asarray(view.cost_log_var_10m, np.float64) / np.where(n > 0, n, 1.0)
                   + np.asarray(view.base_cost_log_var, np.float64) / np.where(nb > 0, nb, 1.0))
            ok = np.isfinite(d) & np.isfinite(se2)
            ratio = np.where(ok, np.exp(np.where(ok, d, 0.0)), np.nan)
            se = np.sqrt(np.where(ok, np.maximum(se2, 0.0), 1.0))
            z = np.where(ok, np.where(se > 0, d / np.where(se > 0, se, 1.0), np.where(d > 0, np.inf, 0.0)), np.nan)
        base_ok = (nb >= th.cost_baseline_min_requests) & (_count(view.base_cost_hours) >= th.cost_baseline_min_hours)
        finite = ok
        valid = (n >= th.cost_min_requests) & base_ok & finite
        q = np.where(finite, ratio, 0.0)
        trip = (q >= th.cost_ratio_trip) & (np.where(finite, z, 0.0) >= self.z)
        rule = np.where(active, q > th.cost_ratio_clear, trip)
        keep = np.asarray(active, bool) & (n > 0) & base_ok
        fired = np.where(valid, rule, keep).astype(bool)
        tok = _count(view.cost_per_token) > 0
        r, b = np.asarray(view.cost_unit_10m, np.float64), np.asarray(view.base_cost_unit, np.float64)
        nan = np.full(r.shape, np.nan)
        return Finding(self.reason, fired, {
            "cost_per_token_usd": np.where(tok, r, nan),
            "cost_baseline_per_token_usd": np.where(tok, b, nan),
            "cost_per_request_usd": np.where(tok, nan, r),
            "cost_baseline_per_request_usd": np.where(tok, nan, b),
            "cost_ratio": ratio,
            "cost_z": z,
            "cost_requests_10m": n,
            "cost_baseline_requests": nb,
        })


_BASE = {"base_cost_log_mean": 0.7, "base_cost_log_var": 1.5, "base_cost_n": 100_000, "base_cost_hours": 24,
         "base_cost_unit": 2e-6, "cost_per_token": 1.0}
SIGNAL = Signal(
    name="cost", kind="advisory", degrades="cost_degrades", params=CostParams, detector=CostRise(),
    windows=CostWindows,
    features=("cost_log_mean_10m", "cost_log_var_10m", "cost_n_10m", "base_cost_log_mean", "base_cost_log_var",
              "base_cost_n", "base_cost_hours", "cost_unit_10m", "base_cost_unit", "cost_per_token"),
    metrics=("cost_per_token_usd", "cost_baseline_per_token_usd", "cost_per_request_usd",
             "cost_baseline_per_request_usd", "cost_ratio", "cost_z", "cost_requests_10m", "cost_baseline_requests"),
    examples=Examples(
        firing={**_BASE, "cost_log_mean_10m": 0.7 + np.log(1.3), "cost_log_var_10m": 1.5, "cost_n_10m": 1_500,
                "cost_unit_10m": 2.6e-6},
        thin=({**_BASE, "cost_log_mean_10m": 2.0, "cost_log_var_10m": 1.5, "cost_n_10m": 99},
              {**_BASE, "cost_log_mean_10m": 2.0, "cost_log_var_10m": 1.5, "cost_n_10m": 1_500, "base_cost_n": 999},
              {**_BASE, "cost_log_mean_10m": 2.0, "cost_log_var_10m": 1.5, "cost_n_10m": 1_500,
               "base_cost_hours": 0},
              # +30 % in a window of 150 requests this spread: not significant (z = 2.6)
              {**_BASE, "cost_log_mean_10m": 0.7 + np.log(1.3), "cost_log_var_10m": 1.5, "cost_n_10m": 150})),
    rule="geometric mean cost per output token (per request without tokens) over 10 min ÷ the same over the 24 "
         "complete hours before the current hour, with a one-sided z test on the logs (p ≤ 1e-5); advisory: reported, weight unchanged "
         "unless `cost_degrades = true`",
    default="report ≥ 1.2 (clears at ≤ 1.1)",
)
