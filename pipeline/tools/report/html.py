"""The incident report as one self-contained HTML file (issue #21): plots embedded as base64 PNG,
no script, no stylesheet or font from the network, so it opens offline and can be mailed.

Names and every table cell pass :func:`pipeline.escape.html_text` (SPEC §8: data, never markup; control
characters shown escaped). Tables carry the numbers exactly as ClickHouse returned them (floats with
up to 6 significant digits, times in UTC ISO 8601); table ids
``summary``, ``impact``, ``probes`` and ``transitions`` are stable for tests and scrapers.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from html import escape
from typing import Any

from pipeline.alert.error_class_text import error_class_line
from pipeline.escape import html_text
from pipeline.tools.report.data import CLASS_METRICS, ReportData, iso_utc
from pipeline.tools.report.plots import PLOTS, STATE_COLOURS

#: Verdict numbers shown in the transitions table (keys of the verdict's metrics).
TRANSITION_NUMBERS = ("latency_p95_ratio", "p95_ms", "baseline_p95_ms", "error_rate_5m", "error_rate_lower_5m",
                      "error_rate_trip", "consecutive_failures", "missing_rate_5m", "quality_score_5m",
                      "route_share")

_CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px;margin-bottom:4px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums} .note{color:#666;font-style:italic}
figure{margin:8px 0} img{max-width:100%} pre{background:#f5f5f5;padding:8px;white-space:pre-wrap;font-size:11px}
.state{padding:1px 6px;border-radius:3px;color:#fff}
"""


def fmt(value: Any) -> str:
    """A cell's text: ``-`` for NULL, floats with up to 6 significant digits, datetimes in UTC ISO 8601.

    >>> fmt(None), fmt(0.123456789), fmt(3.0), fmt([1, 'a'])
    ('-', '0.123457', '3', '1, a')
    """
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat(timespec="milliseconds")
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _state(s: str | None) -> str:
    if s is None:
        return "-"
    return f'<span class="state" style="background:{STATE_COLOURS.get(s, "#777")}">{html_text(s)}</span>'


def _table(table_id: str, head: list[str], rows: list[list[str]]) -> str:
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    return (f'<div style="overflow-x:auto"><table id="{table_id}"><thead><tr>{ths}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def _td(value: Any, num: bool = False) -> str:
    return f'<td class="num">{html_text(fmt(value))}</td>' if num else f"<td>{html_text(fmt(value))}</td>"


def summary_rows(data: ReportData) -> list[list[Any]]:
    """Per channel: requests, failures, error rate (from the minute rows), verdicts, transitions, last state."""
    out = []
    trans = data.transitions()
    for ch in data.channels:
        mins = [m for m in data.minutes if m["channel"] == ch]
        vs = [v for v in data.verdicts if v["channel"] == ch]
        req, fail = sum(m["requests"] for m in mins), sum(m["failures"] for m in mins)
        out.append([ch, req, fail, fail / req if req else None, len(vs),
                    sum(1 for p, v in trans if p is not None and v["channel"] == ch), vs[-1]["state"] if vs else None])
    return out


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def impact_section(data: ReportData) -> list[str]:
    """The "Impact" table (id ``impact``): per channel with an incident, onset, detection, recovery, time to
    detect and to recover, requests failed (and above the baseline) and slowed (:mod:`.impact`)."""
    from pipeline.tools.report.impact import P95_LINE, impacts

    found = impacts(data)
    head = ["channel", "onset (UTC)", "detected (UTC)", "recovered (UTC)", "time to detect", "time to recover",
            "requests", "failed", "failed above baseline", f"in minutes over {P95_LINE:g}x P95"]
    rows = [[_td(i.channel), _td(iso_utc(i.onset) if i.onset else None), _td(iso_utc(i.detected)),
             _td(iso_utc(i.recovered) if i.recovered else "not by the end of the data"),
             f'<td class="num">{_dur(i.detect_s)}</td>', f'<td class="num">{_dur(i.recover_s)}</td>',
             _td(i.requests, True), _td(i.failed, True), _td(i.excess_failed, True), _td(i.slowed, True)]
            for i in found]
    note = ('<p class="note">Onset: the first minute, walked back from detection, over the error-rate trip line '
            f"or {P95_LINE:g}x the baseline P95 (none: no minute was over a line). Counts cover onset (else "
            "detection) to recovery (else the end of the data); slowed counts every request of a minute over "
            "the latency line (an upper bound).</p>")
    if not found:
        return ["<h2>Impact</h2>", '<p class="note">No incident in the window.</p>']
    return ["<h2>Impact</h2>", note, _table("impact", head, rows)]


def overrides_section(data: ReportData) -> list[str]:
    """The "Overrides" table (id ``overrides``): operators' overrides set, cleared or expired in the window."""
    if not data.overrides:
        note = data.overrides_note or "No override was set, cleared or expired in the window."
        return ["<h2>Overrides</h2>", f'<p class="note">{html_text(note)}</p>']
    head = ["at (UTC)", "action", "kind", "channel", "route", "weight", "by", "key id", "reason", "expires (UTC)"]
    rows = [[_td(iso_utc(o["at"]) if isinstance(o["at"], datetime) else o["at"]), _td(o["action"]), _td(o["kind"]),
             _td(o["channel"] or None), _td(o["route"] or None), _td(o["weight"], True), _td(o["by"]),
             _td(o["key_id"] or "unsigned"), _td(o["reason"]),
             _td(iso_utc(o["expires_ts"]) if isinstance(o["expires_ts"], datetime) else o["expires_ts"])]
            for o in data.overrides]
    return ["<h2>Overrides</h2>", _table("overrides", head, rows)]


def class_text(verdict: dict[str, Any]) -> str | None:
    """The error-class line of a verdict row of :data:`~pipeline.tools.report.data.SQL_VERDICTS` (SPEC §4.1,
    :func:`~pipeline.alert.error_class_text.error_class_line`: "dead key on account acct-a (2 channels) —
    <message>"), unescaped; None when no class is behind it."""
    metrics = {k: verdict[k] for k in CLASS_METRICS if verdict.get(k) is not None}
    return error_class_line(list(verdict.get("reasons") or []), metrics)


def probes_section(data: ReportData) -> list[str]:
    """The "Probe schedule" table (id ``probes``): each ``open`` with its attempt in the series, the cooldown
    the worker published and what its probe led to (:mod:`.probes`; SPEC §4.1, §4.2)."""
    from pipeline.policy.defaults import PolicyConfig
    from pipeline.tools.report.probes import as_cells, probe_schedule, schedule_text

    found = probe_schedule(data)
    if not found:
        return ["<h2>Probe schedule</h2>", '<p class="note">No channel opened in the window.</p>']
    head = ["channel", "opened (UTC)", "attempt", "reasons", "cooldown s", "next probe (UTC)", "probed (UTC)",
            "then"]
    rows = []
    for r in found:
        ch, opened, nth, reasons, cool, nxt, probed, then = as_cells(r)
        rows.append([_td(ch), _td(iso_utc(opened)), _td(nth), _td(reasons), _td(cool, True),
                     _td(iso_utc(nxt) if nxt else None), _td(iso_utc(probed) if probed else None), _td(then)])
    note = ('<p class="note">Cooldowns as the worker published them (the open verdict\'s next_probe_ts_ms); each '
            "re-open after a failed probe lengthens the next (SPEC §4.2). Built-in schedules: "
            f"{html_text(schedule_text(PolicyConfig()))}. A probe starts in the first evaluation round at or after "
            "the cooldown's end.</p>")
    return ["<h2>Probe schedule</h2>", note, _table("probes", head, rows)]


def render_html(data: ReportData, source: str) -> str:
    """The report page for ``data``; ``source``: where the data came from (a redacted URL), shown in the header."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>channel-health report: "
             f"{html_text(data.selection)}</title><style>{_CSS}</style></head><body>",
             f"<h1>channel-health report: {html_text(data.selection)}</h1>",
             f"<p>Window (UTC, event time): <b>{escape(iso_utc(data.t0))}</b> to <b>{escape(iso_utc(data.t1))}</b>"
             f" (data until {escape(iso_utc(data.data_end()))}). Data: {escape(source)}. "
             f"Generated {escape(iso_utc(datetime.now(timezone.utc)))}.</p>"]
    head = ["channel", "requests", "failures", "error rate", "verdicts", "state changes", "last state"]
    rows = [[_td(r[0]), *(_td(x, True) for x in r[1:6]), f"<td>{_state(r[6])}</td>"] for r in summary_rows(data)]
    parts += ["<h2>Summary</h2>", _table("summary", head, rows)]
    parts += impact_section(data) + probes_section(data) + overrides_section(data)
    for plot in PLOTS:
        title, png, note = plot(data)
        parts.append(f"<h2>{escape(title)}</h2>")
        if png is None:
            parts.append(f'<p class="note">{escape(note)}</p>')
        else:
            b64 = base64.b64encode(png).decode("ascii")
            parts.append(f'<figure><img alt="{escape(title)}" src="data:image/png;base64,{b64}"></figure>')
    head = ["time (UTC)", "channel", "from", "to", "reasons", "error class", "weight", *TRANSITION_NUMBERS]
    rows = [[_td(v["ts"]), _td(v["channel"]), f"<td>{_state(p['state'] if p else None)}</td>",
             f"<td>{_state(v['state'])}</td>", _td(v["reasons"] or None), _td(class_text(v)), _td(v["weight"], True),
             *(_td(v[k], True) for k in TRANSITION_NUMBERS)] for p, v in data.transitions()]
    parts += ["<h2>Transitions</h2>", '<p class="note">Every change of state in the window, with the reasons and '
              "the detectors' numbers the worker published (the first verdict of each channel has no 'from').</p>",
              _table("transitions", head, rows)]
    parts.append("<h2>The queries behind it</h2>")
    for title, sql, params in data.queries:
        parts.append(f"<h3>{escape(title)}</h3><pre>{escape(sql)}</pre>"
                     f"<pre>params: {escape(json.dumps(params, default=str))}</pre>")
    parts.append("</body></html>\n")
    return "".join(parts)
