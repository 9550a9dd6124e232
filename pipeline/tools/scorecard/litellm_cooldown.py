"""LiteLLM Router's default deployment cooldown.

Source: LiteLLM docs "Router - Load Balancing" (docs.litellm.ai/docs/routing, "Cooldowns") and the
code: ``litellm/router_utils/cooldown_handlers.py`` (``_is_cooldown_required``,
``_should_cooldown_deployment``) with ``litellm/constants.py``: ``DEFAULT_COOLDOWN_TIME_SECONDS`` 5,
``DEFAULT_FAILURE_THRESHOLD_PERCENT`` 0.5, ``DEFAULT_FAILURE_THRESHOLD_MINIMUM_REQUESTS`` 5,
``SINGLE_DEPLOYMENT_TRAFFIC_FAILURE_THRESHOLD`` 1000. With no ``allowed_fails`` / policy set, on each
failure whose status needs a cooldown (429, 401, 404, 408 and every status >= 500) a deployment of a
model group with more than one deployment is cooled down when

* the status is 429 (any single rate-limit answer), or
* failures / requests in the current minute > 50 % with >= 5 requests that minute, or
* every request of the minute failed and there were >= 1000 of them.

The per-minute counts are UTC calendar-minute buckets (``track_deployment_metrics``: key per
deployment and ``%H-%M``); the failing call counts in its own minute. A cooled-down deployment gets no
traffic for 5 s.
"""

from __future__ import annotations

from .baseline import Call

COOLDOWN_MS = 5_000
FAILURE_THRESHOLD = 0.5
MINIMUM_REQUESTS = 5
SINGLE_DEPLOYMENT_ALL_FAILED = 1000


def cooldown_required(http_status: int) -> bool:
    """``_is_cooldown_required``: 429, 401, 404, 408 and every non-4xx status."""
    if 400 <= http_status < 500:
        return http_status in (429, 401, 408, 404)
    return True


class LiteLLMCooldown:
    """One deployment's cooldown state; ``single`` (a group of one) disables the 429 and 50 % rules."""

    def __init__(self, single: bool = False):
        self.single = single
        self.minute = -1
        self.ok = 0
        self.fails = 0
        self.until_ms = 0

    def allows(self, ts_ms: int) -> bool:
        """No traffic while cooling down."""
        return ts_ms >= self.until_ms

    def record(self, call: Call) -> bool:
        """File the call in its minute; True when a failure starts a cooldown."""
        m = call.ts_ms // 60_000
        if m != self.minute:
            self.minute, self.ok, self.fails = m, 0, 0
        if not call.failed:
            self.ok += 1
            return False
        self.fails += 1
        if not cooldown_required(call.http_status):
            return False
        total = self.ok + self.fails
        rate = self.fails / total
        cool = ((call.http_status == 429 and not self.single)
                or (rate == 1.0 and total >= SINGLE_DEPLOYMENT_ALL_FAILED)
                or (rate > FAILURE_THRESHOLD and total >= MINIMUM_REQUESTS and not self.single))
        if cool:
            self.until_ms = call.ts_ms + COOLDOWN_MS
        return cool
