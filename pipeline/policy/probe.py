"""The half-open probe test (SPEC §4 ``half_open -> recovering``) and the
pre-incident baseline rate it compares with.

SPEC §4: a probing channel recovers "if the probe error rate stayed below
0.3 % or below the channel's own pre-incident baseline rate (an upper
confidence bound), so noisy channels can recover". :func:`probe_passes`
decides that; :func:`learn_baseline` keeps the baseline counts it needs.

The baseline is the channel's failures / judged requests (``cancelled`` and
``filtered`` excluded, as in SPEC §4.1) over the rounds it spent
``healthy`` or ``degraded``, exponentially weighted with a time constant of
the 24 h baseline window (SPEC §4.3), so it stops learning the moment the
circuit opens and stays frozen through ``open``/``half_open``/``recovering``:
the outage never enters it.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.stats import wilson_bounds


def learn_baseline(requests: float, failures: float, since_ms: int, now_ms: int, new_requests: float,
                   new_failures: float, tau_ms: int) -> tuple[float, float]:
    """Fold one round's counts into the decayed baseline counts.

    ``requests`` / ``failures``: the baseline counts as of ``since_ms``
    (event time of the last update, ms; 0: never); ``new_*``: the judged
    requests and failures since then (>= 0); ``tau_ms`` (> 0): time
    constant, the 24 h baseline window by default. The old counts decay by
    ``exp(-(now_ms - since_ms) / tau_ms)``, so at a steady rate ``r`` req/s the
    effective sample tends to ``r * tau_ms / 1000`` requests. Returns the new
    ``(requests, failures)``; raises ``ValueError`` for ``tau_ms <= 0``.

    >>> learn_baseline(1000.0, 5.0, 0, 30_000, 300.0, 1.0, 86_400_000)
    (1300.0, 6.0)
    """
    if tau_ms <= 0:
        raise ValueError(f"tau_ms must be > 0, got {tau_ms}")
    decay = math.exp(-max(now_ms - since_ms, 0) / tau_ms) if since_ms > 0 else 1.0
    return requests * decay + float(new_requests), failures * decay + float(new_failures)


def baseline_upper(base_requests: float, base_failures: float, z: float, min_requests: float) -> float:
    """Upper Wilson bound (Wilson 1927) of the baseline failure rate at one-sided quantile ``z``.

    NaN when the baseline holds fewer than ``min_requests`` judged requests
    (``Thresholds.baseline_min_requests``, 500 by default): then no baseline
    is known and only the fixed line applies.
    """
    if not base_requests >= max(min_requests, 1.0):
        return math.nan
    _, hi = wilson_bounds(np.array([base_failures]), np.array([base_requests]), z)
    return float(hi[0])


def probe_passes(failures: float, requests: float, fixed_rate: float, base_upper: float, z: float) -> bool:
    """Whether a half-open probe of ``failures`` in ``requests`` judged requests lets the channel recover.

    Passes when ``requests > 0`` and either

    * the probe's failure rate is below ``fixed_rate`` (SPEC §4: 0.3 %,
      ``Thresholds.half_open_max_error_rate``), or
    * the probe is consistent with the channel's pre-incident rate: the
      probe's lower Wilson bound at ``z`` (one-sided) is at most
      ``base_upper``, the baseline's upper bound (:func:`baseline_upper`;
      NaN = no baseline, this branch never passes).

    Error rates (``PolicyConfig.probe_confidence`` 0.99, z = 2.33; baseline
    7,200 requests at 0.5 %, upper bound 0.73 %; exact binomial sums,
    scipy.stats.binom): a probe at the baseline rate fails 0.2 % of the time
    with 450 requests and 2 % with 45; a probe still failing at 5 % passes
    with probability 1e-4 at 450 requests, 5 % at 150 and 34 % at 45
    (a thin probe with no failure passes the fixed line anyway; the
    recovering channel is then judged by the error-rate detector on its
    traffic since it left ``open``). At 2 % (4x the baseline) a 900-request
    probe passes 9 % of the time. The bounds stay Wilson's, unlike the
    detectors' exact ones (:func:`pipeline.stats.exact_lower`): here
    the probe's lower bound only blocks recovery, and Wilson's lower bound is
    above the exact one at small counts, so it errs toward staying
    ``half_open``; the error rates above are exact sums for this rule.
    """
    if not requests > 0:
        return False
    if failures / requests < fixed_rate:
        return True
    if math.isnan(base_upper):
        return False
    lo, _ = wilson_bounds(np.array([failures]), np.array([requests]), z)
    return bool(lo[0] <= base_upper)
