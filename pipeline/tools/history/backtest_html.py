"""``channel-health backtest --html FILE``: the backtest report as one self-contained HTML page (issue #22 item 1).

Reuses the incident report's page style, table helpers and plot helpers
(:mod:`pipeline.tools.report.html`, :mod:`pipeline.tools.report.plots`):
plots are embedded as base64 PNG, no script, nothing from the network.
Every text from the data (channel names, incident ids, the policy path) is
escaped. Stable ids for tests and scrapers: ``params``, ``totals`` (cells
``transitions_recorded`` / ``_replayed`` / ``_matching``), ``channels``,
``changes`` (gained and lost transitions), ``incidents``, ``clean_periods``.
"""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from pipeline.tools.extras import require_extra
from pipeline.tools.history.backtest import STATES, Timeline
from pipeline.tools.report.html import _CSS, _state, _table, _td, fmt
from pipeline.tools.report.plots import STATE_COLOURS, _figure, _png


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, timezone.utc)


def _delay(ms: int | None) -> str:
    return "missed" if ms is None else f"+{ms / 1000:.0f} s"


def segments(timeline: Timeline, from_ms: int, to_ms: int) -> list[tuple[int, int, str]]:
    """``(start_ms, end_ms, state)`` spans of a timeline on ``[from_ms, to_ms)`` (the start state first)."""
    out: list[tuple[int, int, str]] = []
    state, since = timeline.start_state, from_ms
    for ts, s in timeline.points:
        if state is not None and ts > since:
            out.append((since, ts, state))
        state, since = s, max(since, ts)
    if state is not None and to_ms > since:
        out.append((since, to_ms, state))
    return out


def band_plot(recorded: Timeline, replayed: Timeline, from_ms: int, to_ms: int) -> bytes:
    """Two state bands over ``[from_ms, to_ms)``: recorded (top) and replayed (bottom); PNG bytes."""
    from matplotlib.patches import Patch

    fig, ax = _figure(1.6)
    ax.grid(False)
    for row, tl in ((1, recorded), (0, replayed)):
        for a, b, s in segments(tl, from_ms, to_ms):
            ax.axvspan(_dt(a), _dt(b), ymin=(row + 0.1) / 2, ymax=(row + 0.9) / 2,
                       color=STATE_COLOURS.get(s, "#777777"), lw=0)
    ax.set_yticks([0.25, 0.75], ["replayed", "recorded"], fontsize=8)
    ax.set_ylim(0, 1)
    ax.legend(handles=[Patch(color=c, label=s) for s, c in STATE_COLOURS.items()], fontsize=7, ncol=6,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return _png(fig, SimpleNamespace(t0=_dt(from_ms), t1=_dt(to_ms)))


def render_backtest_html(report: dict[str, Any], policy_file: str | Path | None = None,
                         channels: Sequence[str] | None = None) -> str:
    """The page for :func:`~pipeline.tools.history.backtest.run_backtest`'s report.

    Band plots need the report's ``timelines`` (``keep_timelines=True``); without them the page says so.
    """
    f, t = report["from_ms"], report["to_ms"]
    warm = f - report.get("replay_from_ms", f)
    policy = str(policy_file) if policy_file else "built-in default (SPEC)"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>channel-health backtest</title>"
             f"<style>{_CSS}</style></head><body><h1>channel-health backtest</h1>"]
    params = [("span (UTC, event time)", f"{fmt(_dt(f))} to {fmt(_dt(t))}"),
              ("warm-up replayed before the span", f"{warm / 3_600_000:.2f} h (from {fmt(_dt(f - warm))})"),
              ("policy file", policy), ("channels", ", ".join(channels) if channels else "all"),
              ("events replayed", report.get("events")), ("replay wall clock (s)", report.get("replay_s")),
              ("generated", fmt(datetime.now(timezone.utc)))]
    parts += ["<h2>Parameters</h2>", _table("params", ["parameter", "value"], [[_td(k), _td(v)] for k, v in params])]
    keys = ("transitions_recorded", "transitions_replayed", "transitions_matching")
    totals = [[_td(k.replace("_", " ")), f'<td class="num" id="{k}">{int(report[k])}</td>'] for k in keys]
    parts += ["<h2>Summary</h2>", _table("totals", ["", "count"], totals),
              '<p class="note">Matching: same channel, new state and evaluation round.</p>']

    chans: dict[str, Any] = report["channels"]
    states = [s for s in STATES if any(s in d["time_in_state_ms_recorded"] or s in d["time_in_state_ms_replayed"]
                                       for d in chans.values())]
    detections: dict[str, list[str]] = {}
    for i in report["incidents"]:
        detections.setdefault(i["channel"], []).append(
            f'{i["incident_id"][:8]} {i["kind"]}: {_delay(i["delay_recorded_ms"])} / {_delay(i["delay_replayed_ms"])}')
    clean: dict[str, list[str]] = {}
    for c in report["clean_periods"]:
        clean.setdefault(c["channel"], []).append(
            f'{c["non_healthy_ms_recorded"] / 1000:.0f} s / {c["non_healthy_ms_replayed"] / 1000:.0f} s')
    head = ["channel", "recorded", "replayed", "matching", "gained", "lost",
            *(f"{s} min (rec / rep)" for s in states), "first detection (rec / rep)",
            "non-healthy on clean (rec / rep)"]
    rows = []
    for ch, d in chans.items():
        rec, rep = d["time_in_state_ms_recorded"], d["time_in_state_ms_replayed"]
        rows.append([_td(ch), *(_td(d[k], True) for k in keys), _td(len(d["gained"]), True), _td(len(d["lost"]), True),
                     *(_td(f"{rec.get(s, 0) / 60000:.1f} / {rep.get(s, 0) / 60000:.1f}", True) for s in states),
                     _td("; ".join(detections.get(ch, [])) or None), _td("; ".join(clean.get(ch, [])) or None)])
    parts += ["<h2>Per channel</h2>", _table("channels", head, rows)]

    changes = [[_td(_dt(ts)), _td(ch), _td(kind), f"<td>{_state(a)}</td>", f"<td>{_state(b)}</td>"]
               for ch, d in chans.items() for kind in ("gained", "lost") for ts, a, b in d[kind]]
    changes.sort(key=lambda r: r[0])
    parts += ["<h2>Transitions gained and lost</h2>",
              '<p class="note">Gained: replayed, not recorded; lost: recorded, not replayed.</p>',
              _table("changes", ["time (UTC)", "channel", "", "from", "to"], changes) if changes
              else '<p class="note">none: the replay reproduces every recorded transition</p>']
    if report["incidents"]:
        parts += ["<h2>Labelled incidents</h2>", _table(
            "incidents", ["incident", "channel", "kind", "from", "to", "detected (recorded)", "detected (replayed)"],
            [[_td(i["incident_id"]), _td(i["channel"]), _td(i["kind"]), _td(_dt(i["from_ms"])), _td(_dt(i["to_ms"])),
              _td(_delay(i["delay_recorded_ms"])), _td(_delay(i["delay_replayed_ms"]))] for i in report["incidents"]])]
    if report["clean_periods"]:
        parts += ["<h2>Clean periods</h2>", _table(
            "clean_periods", ["period", "channel", "from", "to", "non-healthy verdicts (rec / rep)",
                              "non-healthy s (rec / rep)"],
            [[_td(c["incident_id"]), _td(c["channel"]), _td(_dt(c["from_ms"])), _td(_dt(c["to_ms"])),
              _td(f'{c["non_healthy_verdicts_recorded"]} / {c["non_healthy_verdicts_replayed"]}'),
              _td(f'{c["non_healthy_ms_recorded"] / 1000:.0f} / {c["non_healthy_ms_replayed"] / 1000:.0f}')]
             for c in report["clean_periods"]])]

    differing = [ch for ch, d in chans.items() if d["gained"] or d["lost"]
                 or d["time_in_state_ms_recorded"] != d["time_in_state_ms_replayed"]]
    parts.append("<h2>States of the channels with differences (recorded above, replayed below)</h2>")
    tls = report.get("timelines")
    if not differing:
        parts.append('<p class="note">no channel differs</p>')
    elif tls is None:
        parts.append('<p class="note">no timelines in this report (run_backtest(keep_timelines=True))</p>')
    for ch in differing if tls is not None else []:
        png = band_plot(tls["recorded"].get(ch, Timeline()), tls["replayed"].get(ch, Timeline()), f, t)
        b64 = base64.b64encode(png).decode("ascii")
        parts.append(f"<h3>{escape(ch)}</h3><figure><img alt=\"states of {escape(ch)}\" "
                     f'src="data:image/png;base64,{b64}"></figure>')
    parts.append("</body></html>\n")
    return "".join(parts)


def write_backtest_html(report: dict[str, Any], out: str | Path, policy_file: str | Path | None = None,
                        channels: Sequence[str] | None = None) -> Path:
    """Render and write the page to ``out`` (parents created); returns its absolute path.

    Raises :class:`~pipeline.tools.extras.MissingExtra` without matplotlib (the ``[tools]`` extra)."""
    require_extra("matplotlib", "channel-health backtest --html")
    path = Path(out).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_backtest_html(report, policy_file, channels), encoding="utf-8")
    return path
