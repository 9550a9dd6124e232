"""Linkerd's consecutive-failures failure accrual with the default annotation values.

Sources: linkerd/linkerd2 ``policy-controller`` ``parse_accrual_config`` (the only mode the annotation
``balancer.linkerd.io/failure-accrual`` accepts is ``consecutive``, off unless set): ``max-failures`` 7,
``min-penalty`` 1 s, ``max-penalty`` 60 s, ``jitter-ratio`` 0.5. linkerd/linkerd2-proxy (HEAD 29637b64):
``linkerd/app/outbound/src/http/breaker/consecutive_failures.rs`` ``ConsecutiveFailures``: ``open`` counts
failures in a row (a success resets) and shuts the endpoint when the count reaches ``max_failures``;
``closed`` keeps it shut for the next backoff, then ``probation`` admits one request (``gate.limit(1)``):
a success re-opens it, a failure shuts it for the next, longer backoff; responses while shut are
ignored; the backoff stream restarts at each trip. ``linkerd/exp-backoff/src/lib.rs``: backoff k is
``min(1 s * 2^k, 60 s)`` plus a uniform jitter on ``[0, base * 0.5]`` capped at ``max - base``
(truncated to whole seconds, see :func:`backoff_ms`). The
default HTTP classifier counts 5xx (and errors, so our timeouts as 504) as failures; a 429 is a success.

Not modelled: the newer "unified" accrual in the proxy (``breaker/unified.rs``: windowed success rate with
``min_requests``) has no default and no annotation in the control plane, so the success rate < 0.8
over 10 s rule is not a default; Peak-EWMA load balancing weighs endpoints by latency but is not a
breaker decision (it ejects nothing), so only the failure-accrual ejection is modelled. The jitter comes
from a seeded ``random.Random`` so a replay is reproducible.
"""

from __future__ import annotations

import random

from .baseline import Call

MAX_FAILURES = 7
MIN_PENALTY_MS = 1_000
MAX_PENALTY_MS = 60_000
JITTER_RATIO = 0.5


def backoff_ms(k: int, jitter_u: float = 0.0, jitter: float = JITTER_RATIO) -> int:
    """The k-th (0-based) shut period, ms: ``min(1 s * 2^k, 60 s)`` plus the jitter
    ``floor(base_s * jitter_u * jitter)`` whole seconds (``jitter_u`` in [0, 1)), capped so the total
    stays <= 60 s. ``ExponentialBackoff::jitter`` builds ``Duration::new(secs as u64, nanos)`` from
    ``base.as_secs() * r`` and ``base.subsec_nanos() * r``: whole-second bases get whole-second jitter,
    so the 1 s and 2 s periods get none."""
    base = min(MIN_PENALTY_MS * 2 ** min(k, 32), MAX_PENALTY_MS)
    extra = int(base // 1000 * jitter_u * jitter) * 1000
    return base + min(extra, MAX_PENALTY_MS - base)


class LinkerdAccrual:
    """One endpoint's consecutive-failures breaker (7 failures; 1 s x 2^k to 60 s, jitter 0.5)."""

    def __init__(self, jitter: float = JITTER_RATIO, seed: int = 0):
        self.jitter, self.rng = jitter, random.Random(seed)
        self.failures = 0
        self.shut = False
        self.k = 0
        self.until_ms = 0

    def allows(self, ts_ms: int) -> bool:
        """Open gate: yes; shut: only once the backoff is over (that call is the one probation request)."""
        return not self.shut or ts_ms >= self.until_ms

    def _shut(self, ts_ms: int) -> None:
        self.shut = True
        self.until_ms = ts_ms + backoff_ms(self.k, self.rng.random(), self.jitter)
        self.k += 1

    def record(self, call: Call) -> bool:
        """File the call; True when it shut the endpoint (the 7th failure in a row, or a failed probe)."""
        failure = call.failed and call.http_status >= 500
        if self.shut:  # probation
            if failure:
                self._shut(call.ts_ms)
                return True
            self.shut, self.failures, self.k = False, 0, 0
            return False
        if not failure:
            self.failures = 0
            return False
        self.failures += 1
        if self.failures == MAX_FAILURES:
            self.failures = 0
            self._shut(call.ts_ms)
            return True
        return False
