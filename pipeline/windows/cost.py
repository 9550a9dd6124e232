"""The ``cost`` signal's own windows (SPEC §4.8): cost sums per 30 s over 10 min and per hour over 24 h.

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
on them (see :mod:`pipeline.signals.cost`) holds its false-alarm rate
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

import numpy as np

from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing

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
        """Count the accepted events that carry a cost in (0, :data:`MAX_COST_USD`] USD (late ones are not
        counted, as in the short ring)."""
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
        for ring in self.rings.values():
            ring.add(ch, ts, rows)

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
