"""Higress ai-proxy's apiToken failover with its defaults.

Source: alibaba/higress (HEAD 4e0d6914, read 2026-12-03), ``plugins/wasm-go/extensions/ai-proxy``:
``provider/failover.go`` ``failover.FromJson``: ``enabled`` default false (switched on here),
``failureThreshold`` 3, ``successThreshold`` 1, ``healthCheckInterval`` 5000 ms, ``healthCheckTimeout``
5000 ms, ``failoverOnStatus`` ``["4.*", "5.*"]``. ``main.go`` ``onHttpResponseHeaders``: a non-200
answer goes to ``ProviderConfig.OnRequestFailed`` -> ``handleUnavailableApiToken`` (count + 1 >= 3
moves the token from the available to the unavailable list; a token already off the list is not
counted), a 200 resets the token's failure count (``ResetApiTokenRequestFailureCount``).
``SetApiTokensFailover``'s tick (every ``healthCheckInterval``) health-checks each unavailable token
with one request; status 200 within the timeout -> ``handleAvailableApiToken`` re-adds it after
``successThreshold`` (1) passes. ``GetGlobalRandomToken``: with no available token left it uses a
random unavailable one.

Modelled: a route's channels as one provider's tokens (one pool per route). The health check of a
removed channel is its first call at or after the next 5 s tick (passes when ok, HTTP 200 and
``probe_ms`` <= 5 s). With every channel removed, calls are served anyway (the random token) and do not
count, as in ``handleUnavailableApiToken``.
"""

from __future__ import annotations

from .baseline import Call, probe_ms

FAILURE_THRESHOLD = 3
HEALTH_CHECK_INTERVAL_MS = 5_000
HEALTH_CHECK_TIMEOUT_MS = 5_000


class HigressFailoverPool:
    """One provider's tokens (the route's channels) under ai-proxy failover with the defaults."""

    def __init__(self, channels: list[str]):
        self.keys = list(channels)
        self.failures = dict.fromkeys(self.keys, 0)
        #: removed channel -> time of its next health check, epoch ms
        self.unavailable: dict[str, int] = {}

    def serving(self, channel: str, ts_ms: int) -> bool:
        """Whether ``channel`` gets traffic: it is available, or no token is (then a random one is used)."""
        return channel not in self.unavailable or len(self.unavailable) == len(self.keys)

    def offer(self, channel: str, call: Call) -> bool:
        """File the call; True when it removed the channel (its 3rd 4xx/5xx in a row)."""
        if channel in self.unavailable:
            if call.ts_ms >= self.unavailable[channel]:  # this call stands for the health check
                if not call.failed and call.http_status == 200 and probe_ms(call) <= HEALTH_CHECK_TIMEOUT_MS:
                    del self.unavailable[channel]
                    self.failures[channel] = 0
                else:
                    self.unavailable[channel] = (call.ts_ms // HEALTH_CHECK_INTERVAL_MS + 1) * HEALTH_CHECK_INTERVAL_MS
            return False
        if not call.failed:
            self.failures[channel] = 0
            return False
        if not 400 <= call.http_status < 600:
            return False
        self.failures[channel] += 1
        if self.failures[channel] < FAILURE_THRESHOLD:
            return False
        self.failures[channel] = 0
        self.unavailable[channel] = (call.ts_ms // HEALTH_CHECK_INTERVAL_MS + 1) * HEALTH_CHECK_INTERVAL_MS
        return True

    def in_service(self, channel: str, ts_ms: int) -> bool:
        """:meth:`serving` (with every token removed, all of them, as ``GetGlobalRandomToken`` picks any)."""
        return self.serving(channel, ts_ms)
