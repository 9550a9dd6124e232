"""Per-route traffic shares with bounded shifts (SPEC §4 "Weights are
normalised within a route ... shifts are bounded per round").

Shares are the channels' weights normalised to sum 1 within a route. A
share may fall at once (a tripped channel must lose its traffic now) but may
grow by at most a factor ``max_growth`` per round (with a floor of +0.05 so
an idle channel can start), so one backup is not handed all the traffic in a
single round; the surplus goes to the other channels with weight, in
proportion to their weights, also capped. Only when every channel is capped
is the cap lifted (the traffic has to go somewhere).
"""

from __future__ import annotations

import numpy as np

MIN_GROWTH_ABS = 0.05


def bounded_shares(weights: np.ndarray, prev_shares: np.ndarray | None, max_growth: float = 1.5) -> np.ndarray:
    """Shares (sum 1, or all 0 when every weight is 0) of one route's channels.

    ``weights`` float (k,) in [0, 1]; ``prev_shares`` float (k,) from the last
    round or None (no bound on the first round); ``max_growth`` >= 1.

    >>> bounded_shares(np.array([0.0, 1.0, 1.0]), np.array([0.6, 0.2, 0.2])).round(3).tolist()
    [0.0, 0.5, 0.5]
    >>> bounded_shares(np.array([0.0, 1.0, 1.0, 1.0]), np.array([0.7, 0.1, 0.1, 0.1])).round(3).tolist()
    [0.0, 0.333, 0.333, 0.333]
    >>> bounded_shares(np.array([0.5, 1.0]), np.array([0.5, 0.5])).round(3).tolist()
    [0.333, 0.667]
    """
    w: np.ndarray = np.clip(np.asarray(weights, dtype=np.float64), 0.0, 1.0)
    total = float(w.sum())
    if total <= 0:
        return np.zeros_like(w)
    target: np.ndarray = w / total
    if prev_shares is None or len(prev_shares) != len(w) or prev_shares.sum() <= 0:
        return target
    if max_growth < 1:
        raise ValueError(f"max_growth must be >= 1, got {max_growth}")
    cap = np.maximum(prev_shares * max_growth, prev_shares + MIN_GROWTH_ABS)
    cap = np.where(w > 0, cap, 0.0)
    if cap.sum() < 1.0:
        return target  # nothing can absorb the traffic within the bound
    share: np.ndarray = np.minimum(target, cap)
    for _ in range(len(w)):
        rest = 1.0 - share.sum()
        room = (cap - share) * (w > 0)
        if rest <= 1e-12 or room.sum() <= 1e-12:
            break
        add = np.minimum(room, rest * (w * (room > 0)) / max((w * (room > 0)).sum(), 1e-12))
        share = share + add
    out: np.ndarray = share / share.sum()
    return out
