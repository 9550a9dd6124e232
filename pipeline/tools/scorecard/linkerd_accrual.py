"""Linkerd's failure accrual: the consecutive-failures count and the unified success-rate window.

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
default HTTP classifier counts 5xx (and errors, so our timeouts as 504) as failures; a 429 is not one.

The success-rate dimension (issue #33 part 6): ``breaker/unified.rs`` ``UnifiedBreaker`` (HEAD 29637b64)
trips on either the consecutive count (5xx only) or a windowed success rate below ``threshold`` once
the window holds ``min_requests`` responses; the window (``breaker/success_rate.rs``
``SuccessRateWindow``, a ring of buckets over ``window``) counts 5xx *and* 429 as failures, is reset
when the circuit re-opens, and a probe answered 429 fails (keeps the circuit shut). The proxy takes
threshold, window and min_requests from the control plane (``linkerd/proxy/client-policy/src/lib.rs``
``Unified``) without defaults of its own; the values here are the ones the issue names (success rate
< 0.8 over 10 s with >= 5 requests). The window is modelled exactly (a deque of the last 10 s), not in
buckets. Peak-EWMA balancing weighs endpoints by latency but ejects nothing, so it is not modelled; a
shut endpoint is out of service (``serving``), its one probation request aside. The jitter comes from
a seeded ``random.Random`` so a replay is reproducible.
"""

from __future__ import annotations

import random
from collections import deque

from .baseline import Call

MAX_FAILURES = 7
MIN_PENALTY_MS = 1_000
MAX_PENALTY_MS = 60_000
JITTER_RATIO = 0.5
#: Unified breaker: trip below this success rate ...
SUCCESS_RATE_THRESHOLD = 0.8
#: ... over this window ...
SUCCESS_RATE_WINDOW_MS = 10_000
#: ... once it holds this many responses (issue #33's values; see the module doc).
MIN_REQUESTS = 5


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
    """One endpoint's unified breaker: 7 consecutive 5xx, or success rate < 0.8 over 10 s with >= 5
    responses (5xx and 429 failing); shut 1 s x 2^k to 60 s with jitter 0.5, one probation request."""

    def __init__(self, jitter: float = JITTER_RATIO, seed: int = 0):
        self.jitter, self.rng = jitter, random.Random(seed)
        self.failures = 0
        self.shut = False
        self.k = 0
        self.until_ms = 0
        #: (ts_ms, failed) of the responses in the success-rate window
        self.window: deque[tuple[int, bool]] = deque()
        self.window_failures = 0

    def allows(self, ts_ms: int) -> bool:
        """Open gate: yes; shut: only once the backoff is over (that call is the one probation request)."""
        return not self.shut or ts_ms >= self.until_ms

    def serving(self, ts_ms: int) -> bool:
        """In the balancer: the gate is open (a shut endpoint's one probation request is not service)."""
        return not self.shut

    def _shut(self, ts_ms: int) -> None:
        self.shut = True
        self.until_ms = ts_ms + backoff_ms(self.k, self.rng.random(), self.jitter)
        self.k += 1

    def record(self, call: Call) -> bool:
        """File the call; True when it shut the endpoint (the 7th 5xx in a row, the success rate under
        0.8 with >= 5 responses in 10 s, or a failed probe: 5xx or 429)."""
        failure = call.failed and call.http_status >= 500
        rate_failure = failure or call.http_status == 429
        if self.shut:  # probation
            if rate_failure:
                self._shut(call.ts_ms)
                return True
            self.shut, self.failures, self.k = False, 0, 0
            self.window.clear()
            self.window_failures = 0
            return False
        self.window.append((call.ts_ms, rate_failure))
        self.window_failures += rate_failure
        while self.window and self.window[0][0] <= call.ts_ms - SUCCESS_RATE_WINDOW_MS:
            self.window_failures -= self.window.popleft()[1]
        self.failures = self.failures + 1 if failure else 0
        n = len(self.window)
        if self.failures >= MAX_FAILURES or (
                n >= MIN_REQUESTS and (n - self.window_failures) / n < SUCCESS_RATE_THRESHOLD):
            self.failures = 0
            self._shut(call.ts_ms)
            return True
        return False
