"""The statistics the signals and the policy use: exact and Wilson binomial bounds, normal quantiles,
CUSUM alarms, safe ratios. Plain numpy/scipy functions, no window or Kafka state; each docstring gives
its guarantee and its source.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaincinv, ndtri  # what scipy.stats.norm.ppf / beta.ppf call; stats costs ~75 MB RSS


def z_for(confidence: float) -> float:
    """One-sided normal quantile for ``confidence`` in (0.5, 1).

    >>> round(z_for(0.9999), 3)
    3.719
    """
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    return float(ndtri(confidence))


def alpha_for(confidence: float) -> float:
    """One-sided error level ``1 - confidence`` for the exact bounds, ``confidence`` in (0.5, 1)
    (``ValueError`` outside, as :func:`z_for`).

    >>> alpha_for(0.9999) == 1.0 - 0.9999
    True
    """
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    return 1.0 - confidence


def wilson_bounds(successes: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval (Wilson 1927) for a binomial proportion, vectorised.

    ``successes`` and ``n`` float arrays of equal shape (0 <= successes <= n);
    returns ``(lower, upper)`` in [0, 1]; NaN where ``n == 0``. Matches
    ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")`` at the
    two-sided level whose one-sided quantile is ``z``.

    >>> lo, hi = wilson_bounds(np.array([1.0]), np.array([20.0]), 3.719)
    >>> round(float(lo[0]), 4), round(float(hi[0]), 4)
    (0.0032, 0.4648)
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = k / n
        z2 = z * z
        denom = 1.0 + z2 / n
        centre = (p + z2 / (2 * n)) / denom
        half = z * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
        lower = np.where(n > 0, np.clip(centre - half, 0.0, 1.0), np.nan)
        upper = np.where(n > 0, np.clip(centre + half, 0.0, 1.0), np.nan)
    return lower, upper


def exact_lower(successes: np.ndarray, n: np.ndarray, alpha: float, only: np.ndarray | None = None) -> np.ndarray:
    """Clopper-Pearson lower bound (Clopper & Pearson 1934, Biometrika 26) at one-sided level ``1 - alpha``.

    ``successes``, ``n``: float arrays of equal shape (0 <= successes <= n); ``alpha`` in (0, 0.5);
    ``only``: bool mask of the same shape, the entries to compute (the others are NaN), so a detector
    pays the Beta quantile only for channels its gate lets through. Returns float64 in
    [0, 1]: ``scipy.stats.beta.ppf(alpha, k, n - k + 1)``, 0 where ``k == 0``, NaN where ``n == 0``.
    Exact: for every true rate ``p`` and every ``n``, P(bound > p) <= alpha, also at small counts
    (the Wilson bound is not: at ``z`` for 1e-6, P(X >= 10 | n = 700, p = 0.35 %) = 2.3e-4 trips it).
    Raises ``ValueError`` for ``alpha`` outside (0, 0.5).

    >>> round(float(exact_lower(np.array([10.0]), np.array([691.0]), 1e-6)[0]), 4)
    0.0019
    """
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    out = np.full(k.shape, np.nan)
    use = (n > 0) if only is None else (np.asarray(only, bool) & (n > 0))
    out[use & (k <= 0)] = 0.0
    big = np.flatnonzero(use & (k > 0))
    if big.size:
        kb, nb = k.ravel()[big], n.ravel()[big]
        out.ravel()[big] = betaincinv(kb, np.maximum(nb - kb + 1.0, 1.0), alpha)
    return out


def exact_upper(successes: np.ndarray, n: np.ndarray, alpha: float, only: np.ndarray | None = None) -> np.ndarray:
    """Clopper-Pearson upper bound at one-sided level ``1 - alpha``: ``beta.ppf(1 - alpha, k + 1, n - k)``,
    1 where ``k == n``; otherwise as :func:`exact_lower` (same arguments, NaN outside ``only`` or where
    ``n == 0``; P(bound < p) <= alpha for every ``p``).

    >>> round(float(exact_upper(np.array([0.0]), np.array([100.0]), 0.01)[0]), 4)
    0.045
    """
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    lo = exact_lower(n - k, n, alpha, only)  # the upper bound of k is 1 - the lower bound of n - k
    return 1.0 - lo


def exact_lower_gate(successes: np.ndarray, n: np.ndarray, line: np.ndarray | float, alpha: float,
                     judged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(above, lower)``: where ``judged`` and the :func:`exact_lower` bound of ``successes / n`` is above
    ``line`` (bool (C,)), and that bound (float64 (C,), NaN where it was not needed).

    ``successes``, ``n``: float arrays (C,) (0 <= successes <= n); ``line``: the rate to beat, per
    channel (C,) or one float, in [0, 1); ``alpha`` as in :func:`exact_lower`; ``judged``: bool (C,),
    the channels with enough data to judge. The bound is at most the point estimate, so it is computed
    only where the estimate itself is above the line (the Beta quantile is the costly part); ``above``
    is False where ``n == 0``. With a true rate at most ``line``, a channel is above with probability
    <= ``alpha`` (Clopper & Pearson 1934, see :func:`exact_lower`).

    >>> above, lower = exact_lower_gate(np.array([10.0, 10.0, 1.0]), np.array([691.0, 600.0, 1000.0]),
    ...                                 0.001, 1e-6, np.array([True, False, True]))
    >>> above.tolist(), round(float(lower[0]), 4), np.isnan(lower[1:]).tolist()
    ([True, False, False], 0.0019, [True, True])
    """
    k = np.asarray(successes, np.float64)
    n = np.asarray(n, np.float64)
    lower = exact_lower(k, n, alpha, judged & (k > line * n))
    return judged & (np.nan_to_num(lower) > line), lower


def cusum_alarm(s: np.ndarray, h: np.ndarray) -> np.ndarray:
    """bool (C,): a CUSUM chart ``s`` at or above its threshold ``h`` (> 0); False where either is NaN
    or ``h`` is 0 (no chart yet). See :mod:`pipeline.windows.cusum`."""
    h = np.nan_to_num(np.asarray(h, np.float64))
    return (h > 0.0) & (np.nan_to_num(np.asarray(s, np.float64)) >= h)


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with NaN where ``den`` is 0 or NaN (no warnings)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)
