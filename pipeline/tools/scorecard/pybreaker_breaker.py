"""pybreaker's default rule: open on ``fail_max`` consecutive failures, retry after ``reset_timeout``.

Source: pybreaker (github.com/danielfm/pybreaker, ``src/pybreaker.py``): ``CircuitBreaker(fail_max=5,
reset_timeout=60)``. ``CircuitBreakerState._handle_error`` increments the failure counter and
``CircuitClosedState.on_failure`` opens when ``counter >= fail_max`` (so on the 5th failure in a row);
``_handle_success`` resets the counter. ``CircuitOpenState.before_call`` refuses calls until
``reset_timeout`` seconds after opening, then lets the next call through half-open; in half-open a
failure reopens and a success (``success_threshold`` 1) closes.
"""

from __future__ import annotations

from .baseline import Call

#: ``CircuitBreaker.__init__`` defaults.
FAIL_MAX = 5
RESET_TIMEOUT_MS = 60_000


class PyBreaker:
    """One channel's pybreaker with the library defaults (``fail_max`` 5, ``reset_timeout`` 60 s)."""

    def __init__(self, fail_max: int = FAIL_MAX, reset_timeout_ms: int = RESET_TIMEOUT_MS):
        self.fail_max, self.reset_timeout_ms = fail_max, reset_timeout_ms
        self.state = "closed"
        self.counter = 0
        self.opened_ms = 0

    def allows(self, ts_ms: int) -> bool:
        """Closed or half-open: yes; open: only once ``reset_timeout`` has passed (then half-open)."""
        if self.state == "open":
            if ts_ms - self.opened_ms < self.reset_timeout_ms:
                return False
            self.state = "half_open"
        return True

    def record(self, call: Call) -> bool:
        """File the call; True when it opened the breaker (from closed or half-open)."""
        if not call.failed:
            self.counter = 0
            if self.state == "half_open":
                self.state = "closed"
            return False
        self.counter += 1
        if self.state == "half_open" or self.counter >= self.fail_max:
            self.state, self.opened_ms = "open", call.ts_ms
            return True
        return False
