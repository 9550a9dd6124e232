"""The statistics the signals and the policy use, each with its guarantee and its source.

- binomial proportions: the exact Clopper-Pearson bounds (:func:`exact_lower`, :func:`exact_upper`,
  :func:`exact_lower_gate`) and the Wilson interval (:func:`wilson_bounds`), with :func:`z_for` /
  :func:`alpha_for` turning a one-sided confidence into a normal quantile or an error level;
- the Bernoulli CUSUM's design (Page 1954; Reynolds & Stoumbos 1999): :class:`CusumDesign`, its
  log-likelihood weights, Siegmund's threshold :func:`threshold_h` and :func:`design_h`, and
  :func:`cusum_alarm`; the per-channel chart state lives in :mod:`pipeline.windows.cusum`, whose
  docstring derives the numbers;
- robust trends: :func:`theil_sen` (Theil 1950, Sen 1968) with its order-statistic slope interval;
- :func:`safe_ratio`.

Plain numpy/scipy functions, no window, Kafka or policy state (the policy imports this module, not
the signal contract).
"""

from __future__ import annotations

from dataclasses import dataclass

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
    or ``h`` is 0 (no chart yet). See :func:`design_h`."""
    h = np.nan_to_num(np.asarray(h, np.float64))
    return (h > 0.0) & (np.nan_to_num(np.asarray(s, np.float64)) >= h)


def safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with NaN where ``den`` is 0 or NaN (no warnings)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / den, np.nan)


DAY_S = 86_400.0


@dataclass(frozen=True)
class CusumDesign:
    """Design of one Bernoulli CUSUM (derivation and measured numbers: :mod:`pipeline.windows.cusum`).

    ``p_floor`` in (0, 0.5): lowest in-control rate assumed; ``shift`` in
    (0, 0.5): absolute rate increase the chart is tuned to (``p1 = max(p0 +
    shift, 2 p0)``); ``arl0_days`` > 0: in-control average run length in
    channel-days (1 / false alarms per channel-day); ``prior_rate`` in
    (0, 0.5) and ``prior_trials`` >= 0: shrinkage of a young channel's rate;
    ``baseline_s`` > 0: time constant of the learned rate (SPEC §4.3: 24 h);
    ``min_rate_per_s`` > 0: lowest traffic assumed when setting ``h``;
    ``cap_h`` > 1: ``S`` is held at most ``cap_h × h`` (how long an alarm
    outlasts its fault, see :mod:`pipeline.windows.cusum`); ``overshoot`` in [0, 0.2]:
    the overshoot correction of ``h`` in units of ``log(p1 / p0)`` (:mod:`pipeline.windows.cusum`: above 0.2 the exact ARL falls below the stated one).
    Raises ``ValueError`` naming the field.
    """

    p_floor: float
    shift: float
    arl0_days: float = 1000.0
    prior_rate: float = 0.005
    prior_trials: float = 2_000.0
    baseline_s: float = DAY_S
    min_rate_per_s: float = 0.05
    cap_h: float = 2.0
    overshoot: float = 0.2

    def __post_init__(self) -> None:
        for name in ("p_floor", "shift", "prior_rate"):
            if not 0.0 < getattr(self, name) < 0.5:
                raise ValueError(f"{name} must be in (0, 0.5), got {getattr(self, name)}")
        for name in ("arl0_days", "baseline_s", "min_rate_per_s"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.cap_h > 1.0:
            raise ValueError(f"cap_h must be > 1, got {self.cap_h}")
        if not 0.0 <= self.overshoot <= 0.2:
            raise ValueError(f"overshoot must be in [0, 0.2], got {self.overshoot}")
        if self.prior_trials < 0:
            raise ValueError(f"prior_trials must be >= 0, got {self.prior_trials}")

    def rates(self, trials: np.ndarray, events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(p0, p1)`` float64 from the learned weighted ``trials`` and ``events`` (arrays, >= 0)."""
        p = (np.asarray(events, np.float64) + self.prior_trials * self.prior_rate) / (
            np.asarray(trials, np.float64) + self.prior_trials + 1e-12)
        p0 = np.clip(p, self.p_floor, 0.45)
        p1 = np.minimum(np.maximum(p0 + self.shift, 2.0 * p0), 0.95)
        return p0, p1


def llr_weights(p0: np.ndarray, p1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-likelihood ratio per event ``log(p1/p0)`` and per non-event ``log((1-p1)/(1-p0))`` (0 < p0 < p1 < 1)."""
    return np.log(p1 / p0), np.log1p(-p1) - np.log1p(-p0)


def kl_bernoulli(p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """Kullback-Leibler divergence KL(Bern(p0) || Bern(p1)) in nats (0 < p0, p1 < 1): the in-control
    drift per trial of the chart, negated."""
    a, b = llr_weights(p0, p1)
    kl: np.ndarray = -(p0 * a + (1.0 - p0) * b)
    return kl


def threshold_h(arl0_trials: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """Decision threshold ``h`` (nats) with Siegmund's ``(e^h - h - 1) / KL(p0||p1) = arl0_trials``.

    ``arl0_trials`` > 0 (float64, broadcast with ``p0``/``p1``); solved by the fixed point
    ``h = log(1 + h + A)``, ``A = arl0_trials * KL`` (monotone, 8 steps reach 1e-6 for A >= 1).

    >>> round(float(threshold_h(np.array(1e6), np.array(0.001), np.array(0.005))), 2)
    7.79
    """
    a = np.asarray(arl0_trials, np.float64) * kl_bernoulli(np.asarray(p0, np.float64), np.asarray(p1, np.float64))
    h: np.ndarray = np.log1p(a)
    for _ in range(8):
        h = np.log1p(h + a)
    return h


def design_h(design: CusumDesign, rate_per_s: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
    """The chart's threshold ``h`` (nats, float64 broadcast of the inputs) at traffic ``rate_per_s``
    (trials/s, floored at ``design.min_rate_per_s``): Siegmund's :func:`threshold_h` for ``arl0_days``
    channel-days, less the overshoot correction ``design.overshoot × log(p1 / p0)`` (:mod:`pipeline.windows.cusum`).

    >>> d = CusumDesign(p_floor=0.0001, shift=0.0045)
    >>> round(float(design_h(d, np.array(4.0), np.array(0.0001), np.array(0.0046))), 2)
    13.4
    """
    arl = design.arl0_days * DAY_S * np.maximum(np.asarray(rate_per_s, np.float64), design.min_rate_per_s)
    h: np.ndarray = threshold_h(arl, p0, p1) - design.overshoot * np.log(np.asarray(p1, np.float64) / p0)
    return h


def _order_stat(sorted_vals: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``sorted_vals[r, k[r]]`` per row (``k`` clipped into range)."""
    k = np.clip(k, 0, sorted_vals.shape[1] - 1).astype(np.int64)
    return np.take_along_axis(sorted_vals, k[:, None], axis=1)[:, 0]


def _median_sorted(sorted_vals: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Median of the first ``m`` (int (R,)) values of each sorted row; NaN where ``m`` is 0."""
    med = 0.5 * (_order_stat(sorted_vals, (m - 1) // 2) + _order_stat(sorted_vals, m // 2))
    return np.where(m > 0, med, np.nan)


def theil_sen(x: np.ndarray, y: np.ndarray, keep: np.ndarray,
              confidence: float = 0.99) -> tuple[np.ndarray, ...]:
    """Theil–Sen fits of ``y`` on ``x``, one per row, over the points where ``keep``.

    ``x``, ``y`` float64 (R, S) (``x`` distinct within a row where kept),
    ``keep`` bool (R, S). Returns ``(slope, intercept, slope_lo, slope_hi,
    n)``, each (R,): the median of the pairwise slopes (Theil 1950, Sen 1968),
    the median of ``y - slope * x`` (the intercept at ``x = 0``, as
    ``scipy.stats.theilslopes``), the ``confidence`` two-sided interval of the
    slope from the normal approximation of Kendall's S (Sen 1968; the ranks
    of ``scipy.stats.theilslopes``, without its tie correction, so never
    narrower) and the number of points. NaN where fewer than 2 points.
    ``confidence`` in (0, 1), else ``ValueError``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    r, s = x.shape
    n = keep.sum(axis=1)
    iu, ju = np.triu_indices(s, 1)
    pair = keep[:, iu] & keep[:, ju]
    with np.errstate(invalid="ignore", divide="ignore"):
        slopes = np.where(pair, (y[:, ju] - y[:, iu]) / (x[:, ju] - x[:, iu]), np.nan)
    slopes.sort(axis=1)  # NaN last
    m = pair.sum(axis=1)
    slope = _median_sorted(slopes, m)
    z = float(ndtri(0.5 + confidence / 2.0))
    half = z * np.sqrt(n * (n - 1.0) * (2.0 * n + 5.0) / 18.0)
    hi = _order_stat(slopes, np.minimum(np.round((m + half) / 2.0), m - 1))
    lo = _order_stat(slopes, np.maximum(np.round((m - half) / 2.0) - 1, 0))
    resid = np.where(keep, y - np.nan_to_num(slope)[:, None] * x, np.nan)
    resid.sort(axis=1)
    icpt = _median_sorted(resid, n)
    none = n < 2
    return (np.where(none, np.nan, slope), np.where(none, np.nan, icpt), np.where(none, np.nan, lo),
            np.where(none, np.nan, hi), n.astype(np.float64))
