"""An incident's impact and timing in the report (issue #35 part 4): requests failed or slowed, time to
detect, time to recover. Pure: reads :class:`~pipeline.tools.report.data.ReportData`, no ClickHouse.

Per channel, the **incident** runs from its first verdict outside ``healthy``/``no_data`` (*detected*) to its
next ``healthy`` verdict (*recovered*; none when it had not recovered by the end of the data).

- **Onset**: the first minute (``channel_minute_stats``) at or before detection, and after the last calm
  minute before it, whose error rate is over the trip line (``error_rate_trip``) or whose P95 is over
  :data:`P95_LINE` x the baseline P95 (``baseline_p95_ms``), both from the first verdict of the incident
  that carries them (a pre-trip verdict of a failure run carries none); the
  minutes are walked back from detection while they stay over a line. None when no minute was over a line
  (then time to detect is not given: the signal that fired had no per-minute line, e.g. quality).
- **Time to detect** = detection - onset; **time to recover** = recovery - detection.
- **Failed requests**: failures of the minutes from onset (else detection) to recovery (else the end of the
  data), and the **excess** over the baseline (``failures - error_baseline_rate x requests``, at least 0).
- **Slowed requests**: requests of those minutes whose P95 was over the latency line: a minute-level count
  (every request of a slow minute counts), an upper bound of the requests slower than the line.

:data:`P95_LINE` 1.8 is the policy's P95-ratio trip (:class:`pipeline.policy.defaults.Thresholds`, SPEC §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pipeline.tools.report.data import CALM_STATES, ReportData

#: The latency line as a multiple of the baseline P95 (the policy's P95-ratio trip, SPEC §4).
P95_LINE = 1.8
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Impact:
    """One channel's first incident in the window (see the module docstring; times UTC, durations s)."""

    channel: str
    onset: datetime | None
    detected: datetime
    recovered: datetime | None
    detect_s: float | None
    recover_s: float | None
    requests: int
    failed: int
    excess_failed: int | None
    slowed: int


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x else None


def _over(m: dict[str, Any], trip: float | None, p95_line_ms: float | None) -> bool:
    rate, p95 = _num(m.get("error_rate")), _num(m.get("p95_latency_ms"))
    return bool((trip is not None and rate is not None and rate > trip)
                or (p95_line_ms is not None and p95 is not None and p95 > p95_line_ms))


def incident_impact(data: ReportData, channel: str) -> Impact | None:
    """The channel's first incident in ``data`` (module docstring), or None when it had none."""
    vs = [v for v in data.verdicts if v["channel"] == channel]
    first = next((i for i, v in enumerate(vs) if v["state"] not in CALM_STATES), None)
    if first is None:
        return None
    det = vs[first]
    rec = next((v for v in vs[first + 1:] if v["state"] == "healthy"), None)
    # the lines of the first verdict of the incident that carries them (a pre-trip verdict may carry none)
    during_v = vs[first:] if rec is None else vs[first:vs.index(rec)]

    def line(key: str) -> float | None:
        return next((x for v in during_v if (x := _num(v.get(key))) is not None), None)

    trip = line("error_rate_trip")
    base_p95 = line("baseline_p95_ms")
    line_ms = P95_LINE * base_p95 if base_p95 else None
    mins = sorted((m for m in data.minutes if m["channel"] == channel), key=lambda m: m["minute"])
    onset = None
    for m in reversed([m for m in mins if m["minute"] <= det["ts"]]):
        if not _over(m, trip, line_ms):
            break
        onset = m["minute"]
    start = onset or det["ts"]
    end = rec["ts"] if rec is not None else data.t1
    during = [m for m in mins if m["minute"] + MINUTE > start and m["minute"] < end]
    requests = sum(int(m["requests"] or 0) for m in during)
    failed = sum(int(m["failures"] or 0) for m in during)
    base_rate = line("error_baseline_rate")
    excess = None if base_rate is None else max(0, round(failed - base_rate * requests))
    slowed = sum(int(m["requests"] or 0) for m in during
                 if line_ms is not None and (_num(m.get("p95_latency_ms")) or 0.0) > line_ms)
    return Impact(channel, onset, det["ts"], rec["ts"] if rec is not None else None,
                  (det["ts"] - onset).total_seconds() if onset is not None else None,
                  (rec["ts"] - det["ts"]).total_seconds() if rec is not None else None,
                  requests, failed, excess, slowed)


def impacts(data: ReportData) -> list[Impact]:
    """:func:`incident_impact` of every selected channel that had an incident, in selection order."""
    return [i for ch in data.channels if (i := incident_impact(data, ch)) is not None]
