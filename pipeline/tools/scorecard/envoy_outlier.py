"""Envoy outlier detection with the proto defaults (consecutive 5xx, ejection, max ejection %).

Source: Envoy API ``config.cluster.v3.OutlierDetection`` (envoyproxy.io/docs/envoy/latest/api-v3/config/
cluster/v3/outlier_detection.proto) and ``source/common/upstream/outlier_detection_impl.cc``:
``consecutive_5xx`` 5 (``enforcing_consecutive_5xx`` 100 %), ``interval`` 10 s, ``base_ejection_time``
30 s (times the host's ejection count, capped by ``max_ejection_time`` 300 s), ``max_ejection_percent``
10 % with ``always_eject_one_host`` false (since Envoy 1.31 the "at least one host" exception needs that
flag): an ejection happens only if ``100 * (ejected + 1) / hosts <= max_ejection_percent``, so a pool of
fewer than 10 hosts ejects nothing. ``consecutive_gateway_failure`` and ``failure_percentage`` are not
enforced by default (0 %); ``success_rate`` needs ``success_rate_minimum_hosts`` 5 hosts with
``success_rate_request_volume`` 100 requests each in an interval, which the scorecard's 2-host routes
never have, so it is not modelled. Local-origin errors (timeouts) count as 5xx
(``split_external_local_origin_errors`` false). A 429 is not a 5xx and resets the count.
"""

from __future__ import annotations

import math

from .baseline import Call

CONSECUTIVE_5XX = 5
INTERVAL_MS = 10_000
BASE_EJECTION_MS = 30_000
MAX_EJECTION_MS = 300_000
MAX_EJECTION_PERCENT = 10.0
#: ``common_lb_config.healthy_panic_threshold`` default (50 %): below it Envoy balances over all hosts.
PANIC_THRESHOLD_PERCENT = 50.0


class EnvoyOutlierPool:
    """One Envoy cluster (a route's channels as hosts) under default outlier detection."""

    def __init__(self, channels: list[str], max_ejection_percent: float = MAX_EJECTION_PERCENT):
        self.hosts = list(channels)
        self.max_pct = max_ejection_percent
        self.consecutive = dict.fromkeys(self.hosts, 0)
        self.ejections = dict.fromkeys(self.hosts, 0)
        self.ejected_until: dict[str, float] = {}
        #: Consecutive-5xx ejections refused by ``max_ejection_percent`` (diagnostic).
        self.refused = 0

    def _sweep(self, ts_ms: int) -> None:
        """Un-eject hosts whose time is up (Envoy does this on the ``interval`` timer)."""
        for h, until in list(self.ejected_until.items()):
            if ts_ms >= until:
                del self.ejected_until[h]

    def offer(self, channel: str, call: Call) -> bool:
        """Skip the call while the host is ejected; else count it; True when it ejected the host."""
        self._sweep(call.ts_ms)
        if channel in self.ejected_until:
            return False
        if not (call.failed and call.http_status >= 500):
            self.consecutive[channel] = 0
            return False
        self.consecutive[channel] += 1
        if self.consecutive[channel] < CONSECUTIVE_5XX:
            return False
        self.consecutive[channel] = 0
        if 100.0 * (len(self.ejected_until) + 1) / len(self.hosts) > self.max_pct:
            self.refused += 1
            return False
        self.ejections[channel] += 1
        # The host returns at the first interval sweep after its ejection time.
        due = call.ts_ms + min(BASE_EJECTION_MS * self.ejections[channel], MAX_EJECTION_MS)
        self.ejected_until[channel] = math.ceil(due / INTERVAL_MS) * INTERVAL_MS
        return True

    def in_service(self, channel: str, ts_ms: int) -> bool:
        """Not ejected (as of the last call), or Envoy's panic mode: with fewer than
        ``healthy_panic_threshold`` (50 %) of the hosts healthy, every host gets traffic."""
        ejected = sum(1 for until in self.ejected_until.values() if ts_ms < until)
        if 100.0 * (len(self.hosts) - ejected) / len(self.hosts) < PANIC_THRESHOLD_PERCENT:
            return True
        return not (channel in self.ejected_until and ts_ms < self.ejected_until[channel])
