"""Where a policy loses its route's requests: expected served requests per time bin against the oracle.

The scorecard's goodput (:mod:`.goodput`) is one number per scenario; this splits it over time, so a
loss can be put on a phase (the onset of a fault, the outage, the wait for a probe, the ramp after it).
Same router model and shares (:func:`.runner.run_seed` with ``shares_out``); per bin ``[lo, hi)`` of
scenario seconds, ``served`` = ``sum_t sum_c S_c D q_c(t, S_c D)`` (expected successful requests) and
``lost`` = the oracle's served minus the policy's (>= 0 up to rounding: the oracle is the per-second
optimum).
"""

from __future__ import annotations

import numpy as np

from .goodput import Truth

__all__ = ["served_per_second", "lost_by_bin"]


def served_per_second(truth: Truth, route: str, shares: np.ndarray) -> np.ndarray:
    """Expected successful requests (n,) of ``route`` on each grid step under ``shares`` (k, n)."""
    rt = truth.routes[route]
    d = rt.demand_rps
    out: np.ndarray = sum((shares[j] * d * truth.success(c, shares[j] * d) for j, c in enumerate(rt.channels)),
                          np.zeros_like(d)) * truth.grid_s
    return out


def lost_by_bin(truth: Truth, route: str, shares: dict[str, dict[str, np.ndarray]],
                bins_s: list[tuple[float, float]], oracle: str = "oracle") -> dict[str, list[float]]:
    """Per policy of ``shares`` (policy -> route -> (k, n), as :func:`.runner.run_seed` fills it): the
    requests of ``route`` it lost against ``oracle`` in each bin ``(lo_s, hi_s)`` of scenario seconds."""
    t = truth.routes[route].t_s
    best = served_per_second(truth, route, shares[oracle][route])
    out: dict[str, list[float]] = {}
    for name, per_route in shares.items():
        if name == oracle:
            continue
        gap = best - served_per_second(truth, route, per_route[route])
        out[name] = [float(gap[(t >= lo) & (t < hi)].sum()) for lo, hi in bins_s]
    return out
