"""Dead man's switch: a critical "pipeline silent" alert when verdicts stop arriving.

Runs on the alert process's own monotonic clock (arrival time, not the
verdicts' event time): the question is whether the worker still publishes,
and a worker that is down publishes nothing. The worker publishes a verdict per
channel per evaluation round while traffic flows, so a silence longer than
``silent_after_s`` means the worker, the broker or the gateways' traffic
stopped. The first verdict after the alert resolves it.
"""

from __future__ import annotations

from pipeline.alert.grouping import Notification

#: Dedup key of the heartbeat alert (PagerDuty ``dedup_key``; the resolve names it too).
HEARTBEAT_KEY = "channel-health/heartbeat"


class Heartbeat:
    """Watches verdict arrivals. ``silent_after_s`` > 0; ``now_s``: start time (the silence counts from there)."""

    def __init__(self, silent_after_s: float, now_s: float):
        self.silent_after_s = silent_after_s
        self.last_s = now_s
        self.firing = False

    def beat(self, now_s: float) -> Notification | None:
        """A verdict arrived at ``now_s``; returns the resolve if the alert was firing."""
        self.last_s = now_s
        if not self.firing:
            return None
        self.firing = False
        return Notification("resolved", HEARTBEAT_KEY, "*", "info", title="pipeline silent: verdicts flow again")

    def check(self, now_s: float) -> Notification | None:
        """The critical alert, once, when nothing arrived for ``silent_after_s``; else None."""
        silent = now_s - self.last_s
        if self.firing or silent < self.silent_after_s:
            return None
        self.firing = True
        return Notification("firing", HEARTBEAT_KEY, "*", "critical", title="pipeline silent",
                            detail=f"No channel.health verdict for {silent:.0f} s (limit {self.silent_after_s:g} s): "
                                   "is the worker, the broker or the gateways' traffic down?")

    def next_due_s(self) -> float | None:
        """When :meth:`check` will next fire, or None while the alert is up."""
        return None if self.firing else self.last_s + self.silent_after_s
