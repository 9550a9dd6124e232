"""The demo's story as plain lines: a folded state-change timeline and a closing summary.

Pure functions of the verdicts (no console, no clock), so the live demo,
a piped run and the tests print the same text.

- :class:`Timeline` turns each channel's state changes into timeline lines.
  A channel whose half-open probes keep failing goes ``open → half_open →
  open`` every ~2 min; those cycles are folded into one line, ``open ↔
  half_open ×8 since +02:05:30 (probes failed)``, printed when the channel
  leaves the cycle or the run ends; :meth:`Timeline.pending` shows the
  running count meanwhile.
- :func:`summary_lines`: per channel, what happened and when — the first
  non-healthy verdict and its delay from the injected fault's start, the
  first trip, how long the circuit stayed open (open + half_open), and
  whether and when it came back to healthy.

Times print as ``+hh:mm:ss`` of scenario time (offset from the replay's
first event); durations as ``4m30s``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.contracts import Verdict

#: The probe cycle a failing channel repeats; folded into one line.
CYCLE_STATES = frozenset({"open", "half_open"})
#: States counted as "not healthy" for the summary's first detection.
BAD_STATES = frozenset({"degraded", "open", "half_open", "recovering"})


def fmt_offset(ts_ms: int, start_ms: int) -> str:
    """``+hh:mm:ss`` of ``ts_ms`` after ``start_ms`` (both event time, ms; negative offsets print as +00:00:00)."""
    s = max(0, (ts_ms - start_ms) // 1000)
    return f"+{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def fmt_duration(ms: int) -> str:
    """``1h02m``, ``4m30s`` or ``45s`` for a duration in ms (>= 0; negative prints as ``-`` + its absolute value)."""
    sign, s = ("-", -ms // 1000) if ms < 0 else ("", ms // 1000)
    if s >= 3600:
        return f"{sign}{s // 3600}h{s // 60 % 60:02d}m"
    if s >= 60:
        return f"{sign}{s // 60}m{s % 60:02d}s"
    return f"{sign}{s}s"


def change_line(prev_state: str, v: Verdict, start_ms: int) -> str:
    """One plain timeline line for ``v`` entering ``v.state`` from ``prev_state``."""
    reasons = ", ".join(v.reasons)
    return (f"{fmt_offset(v.ts_ms, start_ms)}  {v.channel:<28} {prev_state:>10} → {v.state:<10} "
            f"weight {v.weight:.2f}  {reasons}").rstrip()


@dataclass
class _Cycle:
    """A channel's run of open/half_open changes: when it began, probes, failed probes, the lines it holds."""

    since_ms: int
    probes: int = 0
    failed: int = 0
    last_ms: int = 0
    lines: list[str] = field(default_factory=list)


@dataclass
class Timeline:
    """Folds each channel's state changes into timeline lines (see the module docstring).

    ``start_ms``: event time printed as ``+00:00:00``. Feed every verdict in
    publication order to :meth:`add`; print what it returns; at the end print
    :meth:`finish`. ``changes`` keeps every state change per channel (for
    :func:`summary_lines`).
    """

    start_ms: int
    latest: dict[str, Verdict] = field(default_factory=dict)
    changes: dict[str, list[Verdict]] = field(default_factory=dict)
    _cycles: dict[str, _Cycle] = field(default_factory=dict)
    #: route -> ms its every channel's latest verdict had weight 0 (no channel in service; SPEC §4.2)
    dark_ms: dict[str, int] = field(default_factory=dict)
    _dark_since: dict[str, int] = field(default_factory=dict)

    def add(self, v: Verdict) -> list[str]:
        """Lines to print now for verdict ``v`` (empty when its state did not change or a cycle absorbed it)."""
        prev = self.latest.get(v.channel)
        self.latest[v.channel] = v
        self._track_route(v)
        if prev is None:
            self.changes[v.channel] = [v]
            return []
        if prev.state == v.state:
            return []
        self.changes.setdefault(v.channel, []).append(v)
        cycle = self._cycles.get(v.channel)
        if prev.state in CYCLE_STATES and v.state in CYCLE_STATES:
            if cycle is None:  # the first probe of this open circuit
                cycle = self._cycles[v.channel] = _Cycle(since_ms=v.ts_ms)
            cycle.probes += v.state == "half_open"
            cycle.failed += prev.state == "half_open" and v.state == "open"
            cycle.last_ms = v.ts_ms
            cycle.lines.append(change_line(prev.state, v, self.start_ms))
            return []
        out = self._close(v.channel)
        out.append(change_line(prev.state, v, self.start_ms))
        return out

    def _track_route(self, v: Verdict) -> None:
        """Account the time ``v.route`` has no channel at a weight above 0 (its channels' latest verdicts)."""
        dark = all(x.weight <= 0 for x in self.latest.values() if x.route == v.route)
        self.dark_ms.setdefault(v.route, 0)
        since = self._dark_since.get(v.route)
        if dark and since is None:
            self._dark_since[v.route] = v.ts_ms
        elif not dark and since is not None:
            self.dark_ms[v.route] += max(0, v.ts_ms - since)
            del self._dark_since[v.route]

    def route_lines(self, end_ms: int) -> list[str]:
        """Per route (sorted), the time it had no channel in service (weight > 0), up to ``end_ms``."""
        out = []
        for r in sorted(self.dark_ms):
            ms = self.dark_ms[r] + (max(0, end_ms - self._dark_since[r]) if r in self._dark_since else 0)
            out.append(f"route {r}: " + ("a channel in service throughout" if ms == 0
                                         else f"no channel in service for {fmt_duration(ms)}"))
        return out

    def _close(self, channel: str) -> list[str]:
        """The lines of a channel's cycle: as they were for one probe (two changes), else folded."""
        cycle = self._cycles.pop(channel, None)
        if cycle is None:
            return []
        return list(cycle.lines) if len(cycle.lines) <= 2 else [self._cycle_line(channel, cycle)]

    def _cycle_line(self, channel: str, c: _Cycle) -> str:
        state = self.latest[channel].state
        return (f"{fmt_offset(c.last_ms, self.start_ms)}  {channel:<28} open ↔ half_open ×{c.probes} since "
                f"{fmt_offset(c.since_ms, self.start_ms)} ({c.failed} of {c.probes} probes failed; now {state})")

    def pending(self) -> list[str]:
        """The cycles still running, one line each (for a live display; not yet final)."""
        return [self._cycle_line(ch, c) for ch, c in sorted(self._cycles.items())]

    def finish(self) -> list[str]:
        """Close the cycles still running at the end of the run; returns their lines."""
        out = []
        for ch in sorted(self._cycles):
            out.extend(self._close(ch))
        return out


def _open_ms(changes: list[Verdict], end_ms: int) -> int:
    """Time spent in open or half_open (circuit not closed), ms, up to ``end_ms``."""
    total, since = 0, None
    for v in changes:
        if v.state in CYCLE_STATES and since is None:
            since = v.ts_ms
        elif v.state not in CYCLE_STATES and since is not None:
            total += v.ts_ms - since
            since = None
    if since is not None:
        total += max(0, end_ms - since)
    return total


def summary_lines(changes: dict[str, list[Verdict]], faults: dict[str, tuple[int, int]], start_ms: int,
                  end_ms: int) -> list[str]:
    """Per channel (sorted), one line on what happened and when.

    ``changes``: per channel its first verdict and then every verdict that
    changed its state (:attr:`Timeline.changes`); ``faults``: per faulty
    channel ``(start_ms, end_ms)`` of the injected fault (event time);
    ``start_ms``: scenario time 0; ``end_ms``: the run's last event time.
    A channel that never left ``healthy`` (or ``no_data``) gets one short
    line; a channel that went bad with no fault injected says so (a false
    alarm, in a simulation), unless it was overloaded by the route's traffic
    (reason ``over_capacity``, SPEC §4.2: capped, not opened).
    """
    out = []
    for ch in sorted(set(changes) | set(faults)):
        vs = changes.get(ch, [])
        fault = faults.get(ch)
        when = f"fault {fmt_offset(fault[0], start_ms)}–{fmt_offset(fault[1], start_ms)}" if fault else "no fault"
        bad = [v for v in vs if v.state in BAD_STATES]
        if not bad:
            out.append(f"{ch}: {when}; healthy throughout")
            continue
        first = bad[0]
        parts = [when]
        if fault:
            delay = f", {fmt_duration(first.ts_ms - fault[0])} after the fault began"
        elif any("over_capacity" in v.reasons for v in bad):  # SPEC §4.2: the load it took, capped
            delay = " (over capacity: the route's load, no fault of its own)"
        else:
            delay = " (false alarm)"
        parts.append(f"first {first.state} {fmt_offset(first.ts_ms, start_ms)}{delay} "
                     f"({', '.join(first.reasons) or '-'})")
        trip = next((v for v in vs if v.state == "open"), None)
        if trip is not None and trip is not first:
            parts.append(f"open {fmt_offset(trip.ts_ms, start_ms)} ({', '.join(trip.reasons)})")
        if trip is not None:
            probes = sum(v.state == "half_open" for v in vs)
            parts.append(f"circuit open {fmt_duration(_open_ms(vs, end_ms))}, {probes} probe(s)")
        last = vs[-1]
        if last.state == "healthy":
            since = f", {fmt_duration(last.ts_ms - fault[1])} after the fault ended" if fault else ""
            parts.append(f"healthy again {fmt_offset(last.ts_ms, start_ms)}{since}")
        else:
            parts.append(f"still {last.state} at the end ({fmt_offset(end_ms, start_ms)})")
        out.append(f"{ch}: " + "; ".join(parts))
    return out
