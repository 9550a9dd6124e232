"""one-api's metric mode: a channel whose last 10 calls are under 80 % success is disabled.

Source: songquanpeng/one-api (HEAD 8df4a267, read 2026-12-03). ``monitor/metric.go``: ``Emit`` feeds each
relay outcome per channel (``controller/relay.go`` ``Relay``: success of the first try, and every relay
error that ``monitor.ShouldDisableChannel`` does not disable outright: 429, 5xx, timeouts, 4xx alike);
``consumeSuccess`` / ``consumeFail`` drop the oldest entry when the store holds *more than*
``MetricQueueSize`` (10) and then append, so a full store holds 11 calls; only a failure is judged:
with at least 10 calls stored and a success rate under ``MetricSuccessRateThreshold`` (0.8) the store
is cleared and ``MetricDisableChannel`` disables the channel (``common/config/config.go``:
``ENABLE_METRIC`` default **false**, switched on here; queue 10, threshold 0.8).

Keyword disabling (``monitor/manage.go`` ``ShouldDisableChannel``: 401, ``insufficient_quota`` /
authentication types, "credit", "balance", ... ) needs ``AutomaticDisableChannelEnabled``, default false
in ``common/config/config.go``, so it is not part of the defaults and not modelled. Nothing re-enables
a disabled channel by default: ``AutomaticEnableChannelEnabled`` is false and the periodic test
(``controller/channel-test.go`` ``AutomaticallyTestChannels``) runs only when ``CHANNEL_TEST_FREQUENCY``
is set, so a disabled channel stays out until an operator enables it (the rest of the scenario).
"""

from __future__ import annotations

from .baseline import Call

METRIC_QUEUE_SIZE = 10
SUCCESS_RATE_THRESHOLD = 0.8


class OneApiMetric:
    """One channel under one-api's metric mode (queue 10, threshold 0.8, no automatic re-enable)."""

    def __init__(self):
        self.store: list[bool] = []
        self.disabled = False

    def allows(self, ts_ms: int) -> bool:
        """No traffic once disabled (until an operator acts, outside the replay)."""
        return not self.disabled

    def record(self, call: Call) -> bool:
        """``consumeSuccess`` / ``consumeFail``; True when this failure disabled the channel."""
        if len(self.store) > METRIC_QUEUE_SIZE:
            self.store = self.store[1:]
        self.store.append(not call.failed)
        if not call.failed or len(self.store) < METRIC_QUEUE_SIZE:
            return False
        if sum(self.store) / len(self.store) < SUCCESS_RATE_THRESHOLD:
            self.store = []
            self.disabled = True
            return True
        return False
