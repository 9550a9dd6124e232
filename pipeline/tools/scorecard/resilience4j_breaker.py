"""resilience4j's default CircuitBreaker: a count-based window of 100 calls, open at >= 50 % failures.

Source: resilience4j ``CircuitBreakerConfig`` defaults (resilience4j.readme.io/docs/circuitbreaker,
"Create and configure a CircuitBreaker"; ``circuitbreaker/CircuitBreakerConfig.java``):
``slidingWindowType`` COUNT_BASED, ``slidingWindowSize`` 100, ``minimumNumberOfCalls`` 100,
``failureRateThreshold`` 50 (open when the rate is >= the threshold), ``slowCallRateThreshold`` 100 with
``slowCallDurationThreshold`` 60 s, ``waitDurationInOpenState`` 60 s,
``permittedNumberOfCallsInHalfOpenState`` 10, ``automaticTransitionFromOpenToHalfOpenEnabled`` false
(the first call after the wait moves it to half-open). Every exception is recorded as a failure
(``recordExceptions`` empty = all). In half-open, the 10 permitted calls are judged with the same
thresholds; the breaker closes (fresh window) or reopens.
"""

from __future__ import annotations

from collections import deque

from .baseline import Call

WINDOW = 100
MINIMUM_CALLS = 100
FAILURE_RATE_THRESHOLD = 0.50
SLOW_CALL_RATE_THRESHOLD = 1.00
SLOW_CALL_DURATION_MS = 60_000.0
WAIT_OPEN_MS = 60_000
HALF_OPEN_CALLS = 10


class Resilience4jBreaker:
    """One channel's resilience4j CircuitBreaker with the default configuration."""

    def __init__(self):
        self.state = "closed"
        self.window: deque[tuple[bool, bool]] = deque(maxlen=WINDOW)
        self.failures = 0
        self.slow = 0
        self.opened_ms = 0
        self.half: list[tuple[bool, bool]] = []

    def allows(self, ts_ms: int) -> bool:
        """Open: no calls until ``waitDurationInOpenState``; then half-open for 10 calls."""
        if self.state == "open":
            if ts_ms - self.opened_ms < WAIT_OPEN_MS:
                return False
            self.state, self.half = "half_open", []
        return True

    def _open(self, ts_ms: int) -> bool:
        self.state, self.opened_ms = "open", ts_ms
        self.window.clear()
        self.failures = self.slow = 0
        return True

    def record(self, call: Call) -> bool:
        """File the call; True when the window (or the half-open probe) opened the breaker."""
        slow = call.latency_ms >= SLOW_CALL_DURATION_MS
        if self.state == "half_open":
            self.half.append((call.failed, slow))
            if len(self.half) < HALF_OPEN_CALLS:
                return False
            f = sum(x[0] for x in self.half) / len(self.half)
            s = sum(x[1] for x in self.half) / len(self.half)
            if f >= FAILURE_RATE_THRESHOLD or s >= SLOW_CALL_RATE_THRESHOLD:
                return self._open(call.ts_ms)
            self.state = "closed"
            return False
        if len(self.window) == WINDOW:
            old_f, old_s = self.window[0]
            self.failures -= old_f
            self.slow -= old_s
        self.window.append((call.failed, slow))
        self.failures += call.failed
        self.slow += slow
        n = len(self.window)
        if n < MINIMUM_CALLS:
            return False
        if self.failures / n >= FAILURE_RATE_THRESHOLD or self.slow / n >= SLOW_CALL_RATE_THRESHOLD:
            return self._open(call.ts_ms)
        return False
