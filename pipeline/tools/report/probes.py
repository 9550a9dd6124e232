"""The probe schedule of an incident report: each ``open`` with the cooldown the worker gave it (issue #33 part 3).

SPEC §4.2: "each re-open after a failed probe lengthens the cooldown (e.g. 90 s
doubling to 15 min, with jitter), reset after a full recovery"; SPEC §4.1: a
dead key or spent quota probes at most once per 5 min, growing. The worker
publishes each ``open``'s cooldown end as ``next_probe_ts_ms`` (event time,
UTC epoch ms; :meth:`pipeline.policy.state_machine.ChannelMachine.next_probe_ms`);
this module reads it back from the report's verdict rows, so the report shows
the schedule that was applied, not the one the policy file says.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pipeline.policy.defaults import PolicyConfig
from pipeline.tools.report.data import ReportData

#: States that end a series of re-opens: only a full recovery resets the backoff (SPEC §4.2).
_RESET = "healthy"


@dataclass(frozen=True)
class ProbeRow:
    """One ``open`` of a channel.

    attempt: 0 for the first cooldown of a series, ``n`` for the ``n``-th re-open after a failed probe
    (the series restarts after ``healthy``); cooldown_s: ``next_probe_ts_ms`` − the open's time (s; None
    when the verdict did not publish it, e.g. an older worker); next_probe: when the cooldown ends (UTC);
    probed: the first ``half_open`` after it (UTC; None: none in the window), or the round its own traffic
    answered the probe; outcome: what followed the probe: ``re-opened``, ``recovering``, ``healthy``,
    ``no probe in the window`` or :data:`ANSWERED` (SPEC §4.2 probe on evidence: still ``open``, next attempt).
    """

    channel: str
    opened: datetime
    attempt: int
    reasons: tuple[str, ...]
    cooldown_s: float | None
    next_probe: datetime | None
    probed: datetime | None
    outcome: str


def _probe_time(v: dict[str, Any]) -> datetime | None:
    x = v.get("next_probe_ts_ms")
    if not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 <= x < 1e14:
        return None
    return datetime.fromtimestamp(int(x) / 1000, tz=timezone.utc)


#: Outcome of an ``open`` whose own traffic still failed when its cooldown ended (SPEC §4.2 probe on evidence).
ANSWERED = "still failing (its traffic; no half_open)"


def _changes(data: ReportData, channel: str) -> list[tuple[dict[str, Any], bool]]:
    """``channel``'s verdict rows that change its state, and its ``open`` rows that stay ``open`` at or after
    the published probe time with a later one (SPEC §4.2 probe on evidence: its own traffic answered the
    probe, :meth:`pipeline.policy.state_machine.ChannelMachine.probe_answered`), each with that flag."""
    out: list[tuple[dict[str, Any], bool]] = []
    prev: dict[str, Any] | None = None
    due: datetime | None = None
    for v in sorted((v for v in data.verdicts if v["channel"] == channel), key=lambda v: (v["ts"], v["seq"])):
        nxt = _probe_time(v) if v["state"] == "open" else None
        answered = (prev is not None and prev["state"] == v["state"] == "open" and due is not None
                    and nxt is not None and v["ts"] >= due and nxt > due)
        if prev is None or prev["state"] != v["state"] or answered:
            out.append((v, answered))
        due = (nxt or due) if v["state"] == "open" else None
        prev = v
    return out


def probe_schedule(data: ReportData) -> list[ProbeRow]:
    """Every ``open`` entered in the window, in time order, with its attempt in the series, its published
    cooldown and what its probe led to (:class:`ProbeRow`); an ``open`` whose own traffic answered its
    probe (SPEC §4.2) is followed by the next attempt's row at that time, with outcome :data:`ANSWERED`."""
    out: list[ProbeRow] = []
    for ch in data.channels:
        changes = _changes(data, ch)
        states = [v for v, _ in changes]
        attempt = -1
        for i, v in enumerate(states):
            if v["state"] == _RESET:
                attempt = -1
            if v["state"] != "open":
                continue
            attempt += 1
            nxt = _probe_time(v)
            rest = states[i + 1:]
            if rest and changes[i + 1][1]:  # its traffic answered the probe: no half_open
                out.append(ProbeRow(ch, v["ts"], attempt, tuple(v.get("reasons") or ()),
                                    None if nxt is None else (nxt - v["ts"]).total_seconds(), nxt,
                                    rest[0]["ts"], ANSWERED))
                continue
            at = next((j for j, w in enumerate(rest) if w["state"] == "half_open"), None)
            probed = None if at is None else rest[at]
            after = None if at is None or at + 1 >= len(rest) else rest[at + 1]
            outcome = ("no probe in the window" if probed is None else
                       "re-opened" if after is not None and after["state"] == "open" else
                       after["state"] if after is not None else "probing at the end of the window")
            out.append(ProbeRow(ch, v["ts"], attempt, tuple(v.get("reasons") or ()),
                                None if nxt is None else (nxt - v["ts"]).total_seconds(), nxt,
                                probed["ts"] if probed is not None else None, outcome))
    return sorted(out, key=lambda r: (r.opened, r.channel))


def schedule_text(policy: PolicyConfig) -> str:
    """The built-in schedules in words, from ``policy`` (e.g. ``90 s, doubling per re-open to 900 s, ...``)."""
    def one(cause: str) -> str:
        b = policy.backoff(cause)
        return (f"{b.base_ms / 1000:g} s, x{b.factor:g} per re-open up to {b.max_ms / 1000:g} s "
                f"(+0-{b.jitter:.0%} jitter from the second on)")

    return (f"detector trips: {one('')}; dead key or spent quota: {one('quota_exhausted')}; "
            "reset after a full recovery (healthy)")


def as_cells(row: ProbeRow) -> list[Any]:
    """The row's cells for the report table: channel, opened, attempt in words, reasons, cooldown (s),
    next probe, probed, outcome."""
    nth = "first" if row.attempt == 0 else f"re-open {row.attempt}"
    return [row.channel, row.opened, nth, list(row.reasons) or None, row.cooldown_s, row.next_probe, row.probed,
            row.outcome]


__all__ = ["ANSWERED", "ProbeRow", "as_cells", "probe_schedule", "schedule_text"]
