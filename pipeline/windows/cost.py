"""The ``cost`` signal's own windows (SPEC §4.8): cost sums per 30 s over 10 min and per hour over 24 h.

Per channel, two :class:`~pipeline.windows.ring.IntervalRing` s of the same
nine counters (float32) over the requests that carry ``cost_usd``:

======  =====================================================================
column  sum over requests with a finite ``cost_usd >= 0`` (``c``) ...
======  =====================================================================
0 1 2   ... of 1, ``c``, ``c²`` (the per-request unit)
3 .. 8  ... that also carry ``output_tokens > 0`` (``t``): of 1, ``c``, ``t``,
        ``c²``, ``c·t``, ``t²`` (the per-token unit)
======  =====================================================================

- ``short``: 21 × 30 s: the 10 min window (20 whole slots; rounds fall on
  30 s boundaries, SPEC §4) plus the slot being filled;
- ``hourly``: 25 × 1 h: the 24 complete hours before the current hour (the
  rolling baseline of SPEC §4.3) plus the hour being filled.

Memory per channel that has sent cost: (21 + 25) slots × (9 × 4 B counts +
8 B slot id) = 2,024 bytes; a channel that never sends ``cost_usd`` writes
nothing (its pages stay untouched, :func:`~pipeline.windows.ring.small_pages`).

Features (float64, one per channel; NaN where not computable): the window's
and the baseline's cost per unit (``cost_unit_10m`` / ``base_cost_unit``),
the variance of each estimate (``cost_unit_var_10m`` / ``base_cost_unit_var``),
their sample counts (``cost_n_10m`` / ``base_cost_n``), the baseline's hours
holding cost (``base_cost_hours``) and ``cost_per_token`` (1: the unit is an
output token, 0: a request). The unit is the output token when at least half
of the baseline's costed requests carry output tokens, else the request
(SPEC §4.8 "per request when tokens are absent"); the window uses the
baseline's unit so the two are comparable.

Ratio estimator and its variance (Cochran, *Sampling Techniques*, 3rd ed.
1977, §6.3, eq. 6.9, without the finite-population factor): over ``n``
pairs ``(c_i, t_i)``, ``R = Σc / Σt`` and
``Var(R) ≈ n / (n - 1) · Σ(c_i - R t_i)² / (Σt)²`` with
``Σ(c - R t)² = Σc² - 2R Σct + R² Σt²``; the per-request unit is the case
``t_i = 1`` (``Var = s² / n``). float32 sums lose the residual when cost is
exactly proportional to tokens: it is clipped at 0 (the detector's
minimum-effect gate still applies).
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


def cost_rows(cost_usd: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Counter rows (k, 9) float64 of ``k`` costed requests: ``cost_usd`` (k,) finite >= 0 USD,
    ``output_tokens`` (k,) NaN where absent (see the module docstring for the columns)."""
    c = np.asarray(cost_usd, np.float64)
    tok = np.asarray(output_tokens, np.float64)
    has = np.isfinite(tok) & (tok > 0.0)
    t = np.where(has, tok, 0.0)
    ct = np.where(has, c, 0.0)
    return np.stack([np.ones_like(c), c, c * c, has.astype(np.float64), ct, t, ct * ct, ct * t, t * t], axis=1)


def ratio_and_variance(n: np.ndarray, c: np.ndarray, t: np.ndarray, cc: np.ndarray, ct: np.ndarray,
                       tt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(R, Var R)`` of the ratio estimator ``Σc / Σt`` (see the module docstring), float64 arrays.

    NaN ratio where ``t <= 0``; NaN variance where also ``n < 2``. No warnings.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = t > 0
        r = np.where(ok, c / np.where(ok, t, 1.0), np.nan)
        rr = np.where(ok, r, 0.0)
        resid = np.maximum(cc - 2.0 * rr * ct + rr * rr * tt, 0.0)
        big = ok & (n >= 2)
        var = np.where(big, n / np.where(big, n - 1.0, 1.0) * resid / np.where(ok, t * t, 1.0), np.nan)
    return r, var


class CostWindows(RingWindows):
    """Per-channel cost sums of the ``cost`` signal (see the module docstring for layout and memory)."""

    name = "cost"

    def __init__(self, spec: WindowSpec):
        self.baseline_hours = int(spec.baseline_hours)
        self.rings = {"short": IntervalRing(COST_SLOT_MS, COST_WINDOW_MS // COST_SLOT_MS + 1, N_COST_COUNTERS, 0),
                      "hourly": IntervalRing(HOUR_MS, self.baseline_hours + 1, N_COST_COUNTERS, 0)}

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """Count the accepted events that carry cost (late ones are not counted, as in the short ring)."""
        cost = cols.column("cost_usd")
        with np.errstate(invalid="ignore"):
            keep = (cost >= 0.0) & np.isfinite(cost) & ~np.asarray(late, bool)
        if not keep.any():
            return
        rows = cost_rows(cost[keep], cols.column("output_tokens")[keep])
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
        per_token = b[:, 3] >= 0.5 * np.maximum(b[:, 0], 1.0)
        per_token &= b[:, 3] > 0
        out: dict[str, np.ndarray] = {"cost_per_token": per_token.astype(np.float64), "base_cost_hours": hours}
        for key, s in (("10m", w), ("base", b)):
            r_tok, v_tok = ratio_and_variance(s[:, 3], s[:, 4], s[:, 5], s[:, 6], s[:, 7], s[:, 8])
            r_req, v_req = ratio_and_variance(s[:, 0], s[:, 1], s[:, 0], s[:, 2], s[:, 1], s[:, 0])
            unit = np.where(per_token, r_tok, r_req)
            var = np.where(per_token, v_tok, v_req)
            n = np.where(per_token, s[:, 3], s[:, 0])
            if key == "10m":
                out.update(cost_unit_10m=unit, cost_unit_var_10m=var, cost_n_10m=n)
            else:
                out.update(base_cost_unit=unit, base_cost_unit_var=var, base_cost_n=n)
        return out
