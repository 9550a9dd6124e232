"""new-api's automatic channel disabling, switched on, with its periodic channel test re-enabling.

Source: QuantumNous/new-api (read 2026-12-03). ``service/channel.go`` ``ShouldDisableChannel``: with
``common.AutomaticDisableChannelEnabled`` (default **false**, so the operator switches it on) an error
disables the channel when it is a channel-internal error, or its status is in
``operation_setting.AutomaticDisableStatusCodeRanges`` (``setting/operation_setting/status_code_ranges.go``:
default ``{401}`` only), or its lower-cased text contains one of ``operation_setting.AutomaticDisableKeywords``
(``setting/operation_setting/operation_setting.go``, listed in :data:`KEYWORDS`). 429, 5xx and timeouts
are not in the default ranges, so they never disable unless their text holds a keyword (OpenAI's
quota 429 says "You exceeded your current quota", which does). Re-enabling:
``controller/channel-test.go`` ``testChannelForHealthCheck`` tests every channel; a disabled one is
re-enabled (``service.ShouldEnableChannel``, needs ``AutomaticEnableChannelEnabled``, default false:
switched on too) when the test has no error, and an *enabled* one is disabled when the test errs with a
disabling error or takes longer than ``common.ChannelDisableThreshold`` (5.0 s) - a slow test is an
error, so it never re-enables. The test runs every ``AutoTestChannelMinutes`` (10, in
``setting/operation_setting/monitor_setting.go``; ``AutoTestChannelEnabled`` default false, switched on).

Modelled: one breaker per channel. A call disables when :func:`should_disable` holds. Tests run at whole
10 minutes of epoch time (the scorecard's scenarios start on a whole hour); the channel's first call at
or after a test time is the test's outcome (ok and ``probe_ms`` <= 5 s passes; ``probe_ms`` is the
call's time to first token, close to a 16-token "hi" test). Without an ``error_message`` in the event
(the simulator's events have none before issue #32) only the 401 rule can fire; channel-internal errors
(no key left etc.) do not occur in replayed upstream events.
"""

from __future__ import annotations

from .baseline import Call, probe_ms

#: ``AutomaticDisableStatusCodeRanges`` default.
DISABLE_STATUS = frozenset({401})
#: ``AutomaticDisableKeywords`` default, lower-cased (matched case-insensitively in the error text).
KEYWORDS = tuple(k.lower() for k in (
    "Your credit balance is too low", "This organization has been disabled.", "You exceeded your current quota",
    "Permission denied", "The security token included in the request is invalid", "Operation not allowed",
    "Your account is not authorized", "Insufficient balance", "insufficient_balance", "balance is insufficient",
    "balance not enough", "account balance is not enough", "credit balance is not enough", "余额不足", "账户余额不足"))
#: ``AutoTestChannelMinutes`` 10.
TEST_INTERVAL_MS = 600_000
#: ``ChannelDisableThreshold`` 5.0 s.
TEST_DISABLE_THRESHOLD_MS = 5_000


def should_disable(call: Call) -> bool:
    """``ShouldDisableChannel`` for a failed call: status 401 or a disabling keyword in its message."""
    if not call.failed:
        return False
    if call.http_status in DISABLE_STATUS:
        return True
    msg = (call.error_message or "").lower()
    return any(k in msg for k in KEYWORDS)


class NewApiAutoDisable:
    """One channel under new-api with automatic disable, automatic enable and the 10-minute test on."""

    def __init__(self, test_interval_ms: int = TEST_INTERVAL_MS):
        self.interval = test_interval_ms
        self.disabled = False
        self.next_test_ms: int | None = None

    def _test_due(self, ts_ms: int) -> bool:
        if self.next_test_ms is None:
            self.next_test_ms = (ts_ms // self.interval + 1) * self.interval
        return ts_ms >= self.next_test_ms

    def allows(self, ts_ms: int) -> bool:
        """Enabled: yes. Disabled: only the call that stands for the next channel test."""
        return self._test_due(ts_ms) if self.disabled else True

    def serving(self, ts_ms: int) -> bool:
        """In the channel pool (not auto-disabled); a disabled channel's test is not service."""
        return not self.disabled

    def record(self, call: Call) -> bool:
        """File the call (and the channel test it stands for, when one is due); True when it disabled."""
        test = self._test_due(call.ts_ms)
        if test:
            self.next_test_ms = (call.ts_ms // self.interval + 1) * self.interval
        passed = not call.failed and probe_ms(call) <= TEST_DISABLE_THRESHOLD_MS
        if self.disabled:
            if test and passed:
                self.disabled = False
            return False
        if should_disable(call) or (test and probe_ms(call) > TEST_DISABLE_THRESHOLD_MS):
            self.disabled = True
            return True
        return False
