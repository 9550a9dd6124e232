"""Helicone AI Gateway's provider health and rate-limit monitors with their defaults.

Source: Helicone/ai-gateway (HEAD 42d29989, read 2026-12-03). ``ai-gateway/src/config/monitor.rs``
``HealthMonitorConfig::default``: error ``ratio`` 0.10, ``window`` 60 s in 10 buckets, ``interval`` 5 s,
``grace_period`` ``min_requests`` 20. ``src/discover/monitor/health/provider.rs``
``ProviderMonitorInner::check_health`` (run every interval by ``HealthMonitor::run_forever``): with at
least 20 requests counted, 5xx / requests > 0.10 marks the provider unhealthy and sends
``Change::Remove``; a later check that finds it healthy (fewer than 20 requests or ratio <= 0.10) sends
``Change::Insert`` with its configured weight. ``src/metrics/rolling_counter.rs`` ``RollingCounter::total``
sums only the buckets of the *current lap* (60 s periods since start), so the counts drop to zero at
each lap boundary. ``src/dispatcher/service.rs`` ``handle_error_and_rate_limiting``: a 5xx increments
the error count; a 429 sends a rate-limit event with ``extract_retry_after`` (whole seconds).
``src/discover/monitor/rate_limit/provider.rs``: the provider is removed for ``retry_after`` or
``DEFAULT_WAIT_SECONDS`` (30 s), plus ``RATE_LIMIT_BUFFER_SECONDS`` (30 s), then re-inserted; a 429 while
it is already rate-limited is ignored.

Modelled: one monitor per channel (a provider endpoint), laps and 5 s checks at whole multiples of
epoch time (the scorecard's scenarios start on a whole hour), timeouts as 504 (a 5xx). A health
removal happens at a check; the replay dates it at the channel's first call the removal turns away
(at most one inter-arrival after the check). A removed provider gets no calls, so its lap empties and
the first check of the next lap re-adds it at full weight.
"""

from __future__ import annotations

from .baseline import Call

ERROR_RATIO = 0.10
WINDOW_MS = 60_000
INTERVAL_MS = 5_000
MIN_REQUESTS = 20
DEFAULT_WAIT_S = 30
RATE_LIMIT_BUFFER_MS = 30_000


class HeliconeMonitor:
    """One provider endpoint's health (5xx ratio per lap, checked every 5 s) and rate-limit state."""

    def __init__(self):
        self.lap = -1
        self.requests = 0
        self.errors = 0
        self.unhealthy = False
        self.rate_limited_until = 0
        self.next_check: int | None = None

    def advance(self, ts_ms: int) -> bool:
        """Run the health checks due at or before ``ts_ms``; True when one of them removed the provider."""
        if self.next_check is None:
            self.next_check = (ts_ms // INTERVAL_MS + 1) * INTERVAL_MS
        removed = False
        while self.next_check <= ts_ms:
            t = self.next_check
            req, err = (self.requests, self.errors) if t // WINDOW_MS == self.lap else (0, 0)
            bad = req >= MIN_REQUESTS and err / req > ERROR_RATIO
            if bad and not self.unhealthy:
                removed = True
            self.unhealthy = bad
            # no calls until ts_ms: the later checks of this lap see the same counts, those of later laps none
            lap_end = (t // WINDOW_MS + 1) * WINDOW_MS
            self.next_check = lap_end if ts_ms >= lap_end else (ts_ms // INTERVAL_MS + 1) * INTERVAL_MS
        return removed

    def serving(self, ts_ms: int) -> bool:
        """In the balancer: healthy at the last check and not rate-limited."""
        return not self.unhealthy and ts_ms >= self.rate_limited_until

    def record(self, call: Call) -> bool:
        """Count the call in its lap; True when it is a 429 that removed the provider."""
        lap = call.ts_ms // WINDOW_MS
        if lap != self.lap:
            self.lap, self.requests, self.errors = lap, 0, 0
        self.requests += 1
        if call.failed and call.http_status >= 500:
            self.errors += 1
        if call.http_status == 429:
            wait_s = int(call.retry_after_s) if call.retry_after_s is not None else DEFAULT_WAIT_S
            self.rate_limited_until = call.ts_ms + wait_s * 1000 + RATE_LIMIT_BUFFER_MS
            return True
        return False


class HeliconePool:
    """A route's channels, each with its own :class:`HeliconeMonitor` (Helicone's monitors are per endpoint)."""

    def __init__(self, channels: list[str]):
        self.monitors = {c: HeliconeMonitor() for c in channels}

    def offer(self, channel: str, call: Call) -> bool:
        """Run the due checks, skip the call while removed, else count it; True when the provider was
        removed (by a check since its last call, or by this 429)."""
        m = self.monitors[channel]
        removed = m.advance(call.ts_ms)
        if not m.serving(call.ts_ms):
            return removed
        return m.record(call) or removed

    def in_service(self, channel: str, ts_ms: int) -> bool:
        """In the balancer as of its last check (health) and not rate-limited at ``ts_ms``; with every
        provider removed the route has none (Helicone has no fallback to removed providers)."""
        return self.monitors[channel].serving(ts_ms)
