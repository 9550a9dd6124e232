"""SPEC §4.8 cost per unit: the 10 min cost per output token (per request without tokens) vs the 24 h baseline.

Windows: :class:`CostWindows` (10 min of 30 s slots
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

The signal's own windows (SPEC §4.8): cost sums per 30 s over 10 min and per hour over 24 h.

Per channel, two :class:`~pipeline.windows.ring.IntervalRing` s of the same
nine counters (float32) over the requests with ``cost_usd > 0``
(``c``, USD), ``t`` their ``output_tokens`` where > 0:

======  =====================================================================
column  sum over ...
======  =====================================================================
0 1 2   costed requests: 1, ``u = ln(c / 1e-3 USD)``, ``u²``
3 4 5   those with tokens: 1, ``v = ln(c / t / 1e-6 USD)``, ``v²``
6 7 8   ``c`` of all costed requests; ``c`` and ``t`` of those with tokens
======  =====================================================================

(the logs are centred near 0 for typical prices, so float32 sums of squares
keep their variance).

- ``short``: 21 × 30 s: the 10 min window (20 whole slots; rounds fall on
  30 s boundaries, SPEC §4) plus the slot being filled;
- ``hourly``: 25 × 1 h: the 24 complete hours before the current hour (the
  rolling baseline of SPEC §4.3) plus the hour being filled.

Memory per channel that has sent cost: (21 + 25) slots × (9 × 4 B counts +
8 B slot id) = 2,024 bytes; a channel that never sends ``cost_usd`` writes
nothing (its pages stay untouched, :func:`~pipeline.windows.ring.small_pages`).

Why logs: per-request cost per token is heavy-tailed (one long prompt with a
short answer costs 100× the median per output token); a price change
multiplies every request's cost, i.e. shifts the mean of its log. The mean
and variance of the log unit cost are well behaved, so a two-sample z test
on them (the test above) holds its false-alarm rate
where a ratio of sums with a delta-method variance (Cochran 1977 §6.3) did
not (2 of 40 simulated steady channel-days reported a +20 % rise at night).

Features (float64 (C,), NaN where not computable): ``cost_log_mean_10m`` /
``cost_log_var_10m`` / ``cost_n_10m`` (mean, sample variance and count of
the log unit cost over 10 min), ``base_cost_log_mean`` /
``base_cost_log_var`` / ``base_cost_n`` / ``base_cost_hours`` (the same over
the baseline, and its hours with cost), ``cost_unit_10m`` /
``base_cost_unit`` (cost per unit as a ratio of sums, USD: per output token
or per request) and ``cost_per_token`` (1: the unit is the output token, 0:
the request). The unit is the output token when at least half of the
baseline's costed requests carry output tokens, else the request (SPEC §4.8
"per request when tokens are absent"); the window uses the baseline's unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Order, Params, Signal, ThresholdArrays, param
from pipeline.stats import z_for
from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing
from pipeline.windows.view import WindowView

#: Slot of the short ring (ms) and the window it sums (ms): SPEC §4.8 "sustained" rise over 10 min.
COST_SLOT_MS, COST_WINDOW_MS = 30_000, 600_000
HOUR_MS = 3_600_000
N_COST_COUNTERS = 9
#: Largest ``cost_usd`` of one request the signal counts (USD). The contract allows any finite
#: non-negative number; a larger value is no price (and would overflow the float32 sums, so one
#: hostile event would poison the channel's 24 h baseline): such events are stored and judged by
#: every other signal, the cost signal leaves them out.
MAX_COST_USD = 1e6


#: Centring of the logs: ln of 1e-3 USD per request and of 1e-6 USD per output token.
LOG_REQ, LOG_TOK = float(np.log(1e-3)), float(np.log(1e-6))


def cost_columns(cost_usd: np.ndarray, output_tokens: np.ndarray) -> list[np.ndarray]:
    """The 9 counter columns (each float64 (k,)) of ``k`` requests with ``cost_usd`` (k,) > 0 USD and
    ``output_tokens`` (k,) NaN where absent (columns: the module docstring)."""
    c = np.asarray(cost_usd, np.float64)
    tok = np.asarray(output_tokens, np.float64)
    has = np.isfinite(tok) & (tok > 0.0)
    log_c = np.log(c)
    u = log_c - LOG_REQ
    v = np.where(has, log_c - np.log(np.where(has, tok, 1.0)) - LOG_TOK, 0.0)
    return [np.ones_like(c), u, u * u, has.astype(np.float64), v, v * v, c,
            np.where(has, c, 0.0), np.where(has, tok, 0.0)]


def cost_rows(cost_usd: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Counter rows (k, 9) float64 of :func:`cost_columns`."""
    return np.stack(cost_columns(cost_usd, output_tokens), axis=1)


def mean_and_variance(n: np.ndarray, s: np.ndarray, ss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, sample variance)`` from a count, a sum and a sum of squares (float64 arrays).

    NaN mean where ``n < 1``, NaN variance where ``n < 2``; the variance is clipped at 0. No warnings.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n >= 1, s / np.where(n >= 1, n, 1.0), np.nan)
        var = np.where(n >= 2, np.maximum(ss - n * np.where(n >= 1, mean, 0.0) ** 2, 0.0)
                       / np.where(n >= 2, n - 1.0, 1.0), np.nan)
    return mean, var


class CostWindows(RingWindows):
    """Per-channel cost sums of the ``cost`` signal (see the module docstring for layout and memory)."""

    name = "cost"
    columns = ("cost_usd", "output_tokens")

    def __init__(self, spec: WindowSpec):
        self.baseline_hours = int(spec.baseline_hours)
        self.rings = {"short": IntervalRing(COST_SLOT_MS, COST_WINDOW_MS // COST_SLOT_MS + 1, N_COST_COUNTERS, 0),
                      "hourly": IntervalRing(HOUR_MS, self.baseline_hours + 1, N_COST_COUNTERS, 0)}

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """:meth:`add_learning` with every event learning."""
        self.add_learning(cols, late, None)

    def add_learning(self, cols: EventColumns, late: np.ndarray, learn: np.ndarray | None) -> None:
        """Count the accepted events that carry a cost in (0, :data:`MAX_COST_USD`] USD (late ones are not
        counted, as in the short ring); the hourly baseline only those where ``learn`` (bool (n,); None:
        all; SPEC §4.2 healthy time only)."""
        cost = cols.column("cost_usd")
        with np.errstate(invalid="ignore"):
            keep = (cost > 0.0) & (cost <= MAX_COST_USD) & ~np.asarray(late, bool)
        if not keep.any():
            return
        # float32 once for both rings (the rings' dtype: the same rounding as a conversion in each); a
        # small batch as one (n, 9) matrix (fewer numpy calls), a large one as columns (no 144 KB matrix)
        columns = cost_columns(cost[keep], cols.column("output_tokens")[keep])
        rows = (np.array(columns, np.float32).T if len(columns[0]) < 512
                else [c.astype(np.float32) for c in columns])
        ch, ts = cols.channel[keep], cols.ts_ms[keep]
        self.rings["short"].add(ch, ts, rows)
        if learn is None:
            self.rings["hourly"].add(ch, ts, rows)
            return
        sel = np.asarray(learn, bool)[keep]
        if sel.any():
            self.rings["hourly"].add(ch[sel], ts[sel], rows[sel] if isinstance(rows, np.ndarray) else [c[sel] for c in rows])

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        """The window's and the baseline's cost per unit at ``now_ms`` (see the module docstring)."""
        rows = np.asarray(rows, dtype=np.int64)
        short, hourly = self.rings["short"], self.rings["hourly"]
        lo = np.full(rows.shape[0], now_ms - COST_WINDOW_MS, np.int64)
        if since_ms is not None:
            lo = np.maximum(lo, np.asarray(since_ms, np.int64))
        w = short.sum_counts(self.window_mask(short, rows, lo, now_ms), rows)
        hour = now_ms // HOUR_MS
        bmask = self.window_mask(hourly, rows, (hour - self.baseline_hours) * HOUR_MS, hour * HOUR_MS)
        b = hourly.sum_counts(bmask, rows)
        hours = np.einsum("cs,cs->c", bmask, (hourly.counts[rows, :, 0] > 0).astype(np.float32)).astype(np.float64)
        per_token = (b[:, 3] >= 0.5 * b[:, 0]) & (b[:, 3] > 0)
        out: dict[str, np.ndarray] = {"cost_per_token": per_token.astype(np.float64), "base_cost_hours": hours}
        with np.errstate(divide="ignore", invalid="ignore"):
            for key, s in (("_10m", w), ("", b)):
                m_tok, v_tok = mean_and_variance(s[:, 3], s[:, 4], s[:, 5])
                m_req, v_req = mean_and_variance(s[:, 0], s[:, 1], s[:, 2])
                unit_tok = np.where(s[:, 8] > 0, s[:, 7] / np.where(s[:, 8] > 0, s[:, 8], 1.0), np.nan)
                unit_req = np.where(s[:, 0] > 0, s[:, 6] / np.where(s[:, 0] > 0, s[:, 0], 1.0), np.nan)
                pre = "base_" if not key else ""
                out[f"{pre}cost_log_mean{key}"] = np.where(per_token, m_tok, m_req)
                out[f"{pre}cost_log_var{key}"] = np.where(per_token, v_tok, v_req)
                out[f"{pre}cost_n{key}"] = np.where(per_token, s[:, 3], s[:, 0])
                out[f"{pre}cost_unit{key}"] = np.where(per_token, unit_tok, unit_req)
        return out


@dataclass(frozen=True)
class CostParams(Params):
    """Thresholds of ``cost`` (policy table ``[tier.X.cost]``)."""

    #: SPEC §4.8: cost per unit (10 min) / baseline cost per unit (24 h) that reports ``cost``
    #: (dimensionless, > clear; "+20 %") ...
    cost_ratio_trip: float = 1.2
    #: ... and the ratio at or below which the finding clears (hysteresis; >= 1).
    cost_ratio_clear: float = 1.1
    #: Minimum costed requests in the 10 min window (>= 1).
    cost_min_requests: int = param(100, ge=1)
    #: Minimum costed requests in the 24 h baseline (>= 1).
    cost_baseline_min_requests: int = param(1_000, ge=1)
    #: Minimum whole hours with cost in the baseline (>= 1).
    cost_baseline_min_hours: int = param(1, ge=1)
    #: SPEC §4.8 "does not lower the weight unless configured": true → the finding degrades
    #: the channel like a soft signal; false (default) → reported only (bool).
    cost_degrades: bool = param(False, boolean=True)

    ORDER = (Order("cost_ratio_clear", "cost_ratio_trip", floor=1),)


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
