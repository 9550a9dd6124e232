"""Grouping and deduplication of channel alerts, after Prometheus Alertmanager's dispatcher.

One group per verdict ``route``. The first firing channel of a new group
starts ``group_wait``; every channel that fires in that time goes out in one
notification. Later changes (a new channel, a severity change) wait until
``group_interval`` after the last notification, so a storm of 20 channels
within a minute is at most two messages. A group that did not change is
re-sent after ``repeat_interval``; repeated verdicts of a firing channel are
never news by themselves. A channel that turns healthy leaves the group (it is
listed as resolved in the group's next message); once the last one has left,
one resolve for the group goes out (no earlier than ``group_interval`` after
the last notification). A group that fired and cleared inside ``group_wait``
sends nothing (a flap); that is logged.

Pure: time is passed in (monotonic seconds), so tests drive it with a fake clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pipeline.alert.config import RANK, Grouping
from pipeline.contracts import Verdict

log = logging.getLogger("channel_health.alert")


@dataclass(frozen=True)
class Notification:
    """One message to send. ``kind``: ``firing`` or ``resolved``. ``key``: the dedup key (one per group).

    ``severity``: the highest of the firing channels (``info`` for a resolve).
    ``firing``: latest verdict and severity per firing channel; ``resolved``:
    verdicts of channels healthy again since the last message. ``title`` is set
    for alerts not about channels (the heartbeat).
    """

    kind: str
    key: str
    route: str
    severity: str
    firing: tuple[tuple[Verdict, str], ...] = ()
    resolved: tuple[Verdict, ...] = ()
    title: str | None = None
    detail: str = ""
    #: (channel, event time ms its state began) of the firing channels, where the alert process knows it.
    since_ms: tuple[tuple[str, int], ...] = ()


@dataclass
class _Group:
    route: str
    alerts: dict[str, tuple[Verdict, str]] = field(default_factory=dict)
    resolved: dict[str, Verdict] = field(default_factory=dict)
    dirty: bool = False
    next_flush_s: float | None = None
    last_sent_s: float | None = None
    detail: str = ""


class Grouper:
    """Collects channel alerts into per-route groups and says which notifications are due.

    :meth:`observe` takes each verdict with its severity outcome;
    :meth:`due` returns the notifications to send at ``now_s``.
    """

    def __init__(self, grouping: Grouping):
        self.grouping = grouping
        self.groups: dict[str, _Group] = {}

    def observe(self, verdict: Verdict, outcome: str, now_s: float) -> None:
        """Apply one verdict: ``outcome`` a severity (firing), ``resolve`` or ``keep`` (see :mod:`.severity`)."""
        group = self.groups.get(verdict.route)
        if outcome == "keep":
            if group is not None and verdict.channel in group.alerts:
                group.alerts[verdict.channel] = (verdict, group.alerts[verdict.channel][1])
            return
        if outcome == "resolve":
            if group is None or verdict.channel not in group.alerts:
                return
            del group.alerts[verdict.channel]
            group.resolved[verdict.channel] = verdict
            if not group.alerts:
                after = now_s if group.last_sent_s is None else group.last_sent_s + self.grouping.group_interval_s
                group.next_flush_s = max(now_s, after)
            return
        if group is None:
            group = self.groups[verdict.route] = _Group(verdict.route)
        before = group.alerts.get(verdict.channel)
        group.alerts[verdict.channel] = (verdict, outcome)
        group.resolved.pop(verdict.channel, None)
        if before is not None and before[1] == outcome:
            return  # a repeat: suppressed
        group.dirty = True
        if group.last_sent_s is None:
            start = now_s + self.grouping.group_wait_s
        else:
            start = max(now_s, group.last_sent_s + self.grouping.group_interval_s)
        if group.next_flush_s is None or start < group.next_flush_s:
            group.next_flush_s = start

    def note_restart(self) -> None:
        """Mark every group's next message as re-announced after an alert-process restart."""
        for g in self.groups.values():
            g.detail = "still firing after an alert-process restart (state rebuilt from channel.health)"

    def due(self, now_s: float, *, flush_all: bool = False) -> list[Notification]:
        """Notifications due at ``now_s`` (``flush_all``: every pending one, ignoring the waits)."""
        out: list[Notification] = []
        for key in list(self.groups):
            g = self.groups[key]
            ready = flush_all or (g.next_flush_s is not None and now_s >= g.next_flush_s)
            if not g.alerts:
                if ready:
                    if g.last_sent_s is not None:
                        out.append(Notification("resolved", f"channel-health/{g.route}", g.route, "info",
                                                resolved=tuple(g.resolved.values())))
                    else:
                        log.info("route %s: channels fired and recovered within group_wait; nothing sent", g.route)
                    del self.groups[key]
                continue
            repeat = (not g.dirty and g.last_sent_s is not None
                      and now_s >= g.last_sent_s + self.grouping.repeat_interval_s)
            if (g.dirty and ready) or repeat:
                severity = max((sev for _, sev in g.alerts.values()), key=RANK.__getitem__)
                out.append(Notification("firing", f"channel-health/{g.route}", g.route, severity,
                                        firing=tuple(g.alerts[c] for c in sorted(g.alerts)),
                                        resolved=tuple(g.resolved.values()), detail=g.detail))
                g.resolved.clear()
                g.detail = ""
                g.dirty, g.next_flush_s, g.last_sent_s = False, None, now_s
        return out

    def next_due_s(self) -> float | None:
        """The earliest pending flush or repeat time, or None when nothing is pending."""
        times = [g.next_flush_s for g in self.groups.values() if g.next_flush_s is not None]
        times += [g.last_sent_s + self.grouping.repeat_interval_s for g in self.groups.values()
                  if g.alerts and g.last_sent_s is not None]
        return min(times, default=None)
