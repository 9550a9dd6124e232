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

from typing import Iterable

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


# --------------------------------------------------------------------------- route protection (SPEC §4.2)

#: Reason codes of a hard error class (SPEC §4.1/§4.2: a credential the provider refuses, a spent
#: quota): a channel with one of these among its current reasons is broken for every request, so the
#: panic floor never hands it traffic, and a route whose every channel has one is ``route_down``.
HARD_FAULT_REASONS = frozenset({"credential_invalid", "quota_exhausted"})
#: Reason published by a channel that the panic floor keeps in service.
ROUTE_PANIC = "route_panic"
#: Reason published by every channel of a route whose every channel has a hard fault.
ROUTE_DOWN = "route_down"
#: A panic candidate failing at least this share of its recent requests is raised only when nothing
#: else of the route is left in service (never a blackout by inference, but no traffic moved onto a
#: channel that fails most of it while another channel still serves).
PANIC_MAX_FAILURE_RATIO = 0.5


def has_hard_fault(reasons: Iterable[str]) -> bool:
    """Whether a channel's current ``reasons`` include a hard error class (:data:`HARD_FAULT_REASONS`).

    >>> has_hard_fault(["error_rate", "quota_exhausted"]), has_hard_fault(["error_rate"])
    (True, False)
    """
    return not HARD_FAULT_REASONS.isdisjoint(reasons)


def panic_floor(weights: np.ndarray, failure_ratio: np.ndarray, eligible: np.ndarray, probing: np.ndarray,
                threshold: float, floor: float, full_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Envoy's panic threshold for one route (SPEC §4.2 "never black out a route by inference").

    ``weights`` float (k,) in [0, 1] (the channels' own weights); ``failure_ratio`` float (k,) in
    [0, 1], recent failures / requests (the least bad first); ``eligible`` bool (k,): may be kept in
    service (no hard fault, has data); ``probing`` bool (k,): ``half_open`` (it gets its probe share);
    ``threshold`` in [0, 1]; ``floor`` in (0, 1]: the weight a kept channel gets; ``full_weight`` in
    (0, 1]: the weight from which a channel counts as wholly in service (a healthy channel's weight
    after the most penalty it can carry, ``1 - max_penalty``).

    The weight left in service is ``sum_c min(1, w_c / full_weight)`` over the channels that are not
    probing, of the route's normal ``k``. Under ``threshold x k``, candidates (eligible, weight under
    ``floor``) are raised to ``floor`` until the weight left reaches ``threshold x k``: those failing
    less than :data:`PANIC_MAX_FAILURE_RATIO` of their recent requests first (not probing before
    probing, then the least bad), and one failing more only while nothing of the route is left in
    service (then the least bad is kept, whatever it is: no blackout by inference). A probing channel
    that is kept is then in service in its own right, not held to its probe share.
    Returns ``(weights, panicked)``. Source of the idea and the 50 % default: Envoy's
    ``healthy_panic_threshold`` (cluster ``common_lb_config``), which balances over every host when
    fewer than 50 % are healthy.

    >>> w, p = panic_floor(np.array([0.0, 0.0]), np.array([1.0, 0.03]), np.array([True, True]),
    ...                    np.array([False, False]), 0.5, 0.5, 0.7)
    >>> w.tolist(), p.tolist()
    ([0.0, 0.5], [False, True])
    >>> panic_floor(np.array([0.98, 0.0]), np.array([0.0, 0.04]), np.array([True, True]),
    ...             np.array([False, False]), 0.5, 0.5, 0.7)[1].tolist()  # one healthy channel of 2: no panic
    [False, False]
    """
    w = np.asarray(weights, dtype=np.float64).copy()
    panicked = np.zeros(len(w), bool)
    need = threshold * len(w) - 1e-12
    probing = np.asarray(probing, bool)
    left = float((np.minimum(1.0, w / full_weight) * ~probing).sum())
    if left >= need:
        return w, panicked
    order = sorted((i for i in range(len(w)) if eligible[i] and w[i] < floor),
                   key=lambda i: (bool(failure_ratio[i] >= PANIC_MAX_FAILURE_RATIO), bool(probing[i]),
                                  float(failure_ratio[i]), i))
    for i in order:
        if left >= need:
            break
        if left > 0 and failure_ratio[i] >= PANIC_MAX_FAILURE_RATIO:
            continue
        left += min(1.0, floor / full_weight) - (0.0 if probing[i] else min(1.0, w[i] / full_weight))
        w[i] = floor
        panicked[i] = True
    return w, panicked


def probe_capped(shares: np.ndarray, weights: np.ndarray, probing: np.ndarray,
                 full_weight: float = 1.0) -> np.ndarray:
    """Shares with each ``probing`` (``half_open``) channel held to its probe share (SPEC §4.2).

    ``shares``, ``weights`` float (k,); ``probing`` bool (k,); ``full_weight`` in (0, 1]: the weight
    from which a channel counts wholly in service (``1 - max_penalty``). A probing channel's probe
    share is what its weight ``w`` gets beside the other channels at their weight, each counted at
    least at ``full_weight``: ``w / (w + sum_o max(w_o, full_weight))`` (0.05 beside one open channel,
    full 0.7: 0.067; beside a healthy one at 0.97: 0.049, the plain normalised share). The excess goes
    to the channels that are not probing and have weight, in proportion to their shares (their
    weights where their shares are 0); with none, the shares stay (the traffic has to go somewhere).

    >>> probe_capped(np.array([1.0, 0.0]), np.array([0.05, 0.0]), np.array([True, False])).tolist()
    [1.0, 0.0]
    >>> probe_capped(np.array([0.09, 0.91]), np.array([0.05, 0.5]), np.array([True, False]), 0.7).round(4).tolist()
    [0.0667, 0.9333]
    """
    k = len(shares)
    if not probing.any() or k < 2:
        return shares
    counted = np.maximum(weights, full_weight)
    cap = np.where(probing, weights / (weights + counted.sum() - counted), 1.0)
    over = np.maximum(shares - cap, 0.0) * probing
    excess = float(over.sum())
    takers = ~probing & (weights > 0)
    if excess <= 1e-12 or not takers.any():
        return shares
    basis = np.where(takers, shares, 0.0)
    if basis.sum() <= 0:
        basis = np.where(takers, weights, 0.0)
    out: np.ndarray = shares - over + excess * basis / basis.sum()
    return out
