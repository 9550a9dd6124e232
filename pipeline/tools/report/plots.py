"""The incident report's plots (issue #21), drawn with matplotlib and returned as PNG bytes.

Each function takes :class:`~pipeline.tools.report.data.ReportData` and
returns ``(title, png bytes or None, note)``: ``None`` with a note when the
data has nothing to draw (e.g. "no quota data"). The x axis is UTC event time.
Lines from the policy: P95 ratio trip 1.8 / clear 1.2 and the error-rate
trip line come from the verdicts (``error_rate_trip``) and from
:class:`pipeline.policy.defaults.Thresholds` (SPEC §4.1-§4.2).

Channel names are data (SPEC §8): every label that holds one passes
:func:`pipeline.escape.plot_text`, so ``x/$\\undefinedcommand$`` is drawn as
written, never parsed as mathtext.
"""

from __future__ import annotations

import io
from typing import Any, Callable

from pipeline.escape import plot_text
from pipeline.tools.report.data import ReportData, iso_utc

#: Band colours per state (the demo's colours, SPEC §4 states).
STATE_COLOURS = {"healthy": "#2e9e44", "degraded": "#e6b400", "open": "#d62728", "half_open": "#b04fc4",
                 "recovering": "#17becf", "no_data": "#bbbbbb"}
Plot = tuple[str, "bytes | None", str]


def _figure(height_in: float = 2.6):
    import matplotlib

    matplotlib.use("Agg")  # no display; the report is a file
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, height_in), dpi=90)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _png(fig, data: ReportData) -> bytes:
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    for ax in fig.axes:
        ax.set_xlim(data.t0, data.t1)  # every plot on the same time axis
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz="UTC"))
    if fig.axes:  # one notation: UTC clock times, the absolute start written out (issue #35)
        fig.axes[-1].set_xlabel(f"UTC event time, window from {iso_utc(data.t0)}", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _none(fig, title: str, note: str) -> Plot:
    import matplotlib.pyplot as plt

    plt.close(fig)
    return title, None, note


def _series(rows: list[dict[str, Any]], channel: str, x: str, y: str) -> tuple[list, list]:
    pts = [(r[x], r[y]) for r in rows if r["channel"] == channel and r[y] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _lines(data: ReportData, rows: list[dict[str, Any]], x: str, y: str, ax, style: str = "-", label: str = "",
           scale: float = 1.0) -> int:
    drawn = 0
    for ch in data.channels:
        xs, ys = _series(rows, ch, x, y)
        if xs:
            ax.plot(xs, [v * scale for v in ys], style, drawstyle="steps-post", lw=1.2,
                    label=plot_text(f"{ch} {label}".strip()))
            drawn += 1
    return drawn


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", framealpha=0.8)


def state_bands(data: ReportData) -> Plot:
    """One row per channel, coloured by the state of each verdict until the next one."""
    title = "State over time"
    if not data.verdicts:
        return title, None, "no verdicts in the window"
    fig, ax = _figure(1.0 + 0.45 * len(data.channels))
    ax.grid(False)
    for row, ch in enumerate(data.channels):
        vs = [v for v in data.verdicts if v["channel"] == ch]
        for v, nxt in zip(vs, vs[1:] + [None]):
            end = nxt["ts"] if nxt else max(v["ts"], data.data_end(ch))  # stops at the data
            ax.axvspan(v["ts"], end, ymin=(row + 0.1) / len(data.channels), ymax=(row + 0.9) / len(data.channels),
                       color=STATE_COLOURS.get(v["state"], "#777777"), lw=0)
    ax.set_yticks([(i + 0.5) / len(data.channels) for i in range(len(data.channels))],
                  [plot_text(ch) for ch in data.channels], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_xlim(data.t0, data.t1)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=s) for s, c in STATE_COLOURS.items()], fontsize=7, ncol=6,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    return title, _png(fig, data), ""


def traffic(data: ReportData) -> Plot:
    """Requests per event-time minute (``channel_minute_stats.requests``)."""
    fig, ax = _figure()
    if not _lines(data, data.minutes, "minute", "requests", ax):
        return _none(fig, "Traffic", "no requests in the window")
    ax.set_ylabel("requests / min")
    _legend(ax)
    return "Traffic (requests per minute)", _png(fig, data), ""


def latency(data: ReportData) -> Plot:
    """P95 latency of the 5 min window against its baseline, with the trip (x1.8) and clear (x1.2) lines."""
    from pipeline.policy.defaults import Thresholds

    th = Thresholds()
    fig, ax = _figure()
    if not _lines(data, data.verdicts, "ts", "p95_ms", ax, label="P95 (5 min)"):
        return _none(fig, "P95 latency", "no latency numbers in the verdicts")
    _lines(data, data.verdicts, "ts", "baseline_p95_ms", ax, "--", "baseline")
    _lines(data, data.verdicts, "ts", "baseline_p95_ms", ax, ":", f"trip x{th.latency_ratio_trip:g}",
           th.latency_ratio_trip)
    _lines(data, data.verdicts, "ts", "baseline_p95_ms", ax, "-.", f"clear x{th.latency_ratio_clear:g}",
           th.latency_ratio_clear)
    ax.set_ylabel("ms")
    _legend(ax)
    return f"P95 latency against its baseline (trip x{th.latency_ratio_trip:g}, clear x{th.latency_ratio_clear:g})", \
        _png(fig, data), ""


def error_rate(data: ReportData) -> Plot:
    """Error rate of the 5 min window, the Wilson lower bound the test uses, and the trip line (in %)."""
    fig, ax = _figure()
    if not _lines(data, data.verdicts, "ts", "error_rate_5m", ax, label="error rate (5 min)", scale=100):
        return _none(fig, "Error rate", "no error-rate numbers in the verdicts")
    _lines(data, data.verdicts, "ts", "error_rate_lower_5m", ax, "--", "test's lower bound", 100)
    _lines(data, data.verdicts, "ts", "error_rate_trip", ax, ":", "trip line", 100)
    ax.set_ylabel("%")
    _legend(ax)
    return "Error rate with the trip line and the test's lower bound", _png(fig, data), ""


def content(data: ReportData) -> Plot:
    """Missing-field rate (5 min) and the quality score (5 min) against its baseline."""
    fig, ax = _figure()
    n = _lines(data, data.verdicts, "ts", "missing_rate_5m", ax, label="missing fields (5 min)")
    n += _lines(data, data.verdicts, "ts", "quality_score_5m", ax, label="quality P(good) (5 min)")
    n += _lines(data, data.verdicts, "ts", "quality_baseline", ax, "--", "quality baseline")
    if not n:
        return _none(fig, "Missing fields and quality",
                     "no missing-field or quality data (no structured or scored responses)")
    ax.set_ylabel("share 0..1")
    _legend(ax)
    return "Missing fields and quality", _png(fig, data), ""


def quota(data: ReportData) -> Plot:
    """Lowest ``quota_remaining`` per minute (share 0..1) and, where the ``quota`` signal judged the
    channel, its forecast of the share left in 30 min (remaining − drain per h × 0.5, floored at 0:
    at 0 the signal's 30 min horizon fires; SPEC §4.7, :mod:`pipeline.signals.quota`)."""
    fig, ax = _figure()
    if not _lines(data, data.extras, "minute", "quota_remaining_min", ax, label="quota remaining"):
        return _none(fig, "Quota", "no quota data (no request reported quota_remaining)")
    ahead = [{"channel": r["channel"], "ts": r["ts"],
              "in_30m": None if r.get("quota_remaining") is None or r.get("quota_drain_per_h") is None
              else max(r["quota_remaining"] - 0.5 * r["quota_drain_per_h"], 0.0)} for r in data.verdicts]
    forecast = _lines(data, ahead, "ts", "in_30m", ax, "--", "forecast in 30 min")
    ax.set_ylabel("share 0..1")
    _legend(ax)
    return "Quota remaining" + ("" if forecast else " (no forecast: quota not judged)"), _png(fig, data), ""


def stalls(data: ReportData) -> Plot:
    """Longest gap between streamed chunks per minute (``max_stream_gap_ms``), where reported."""
    fig, ax = _figure()
    if not _lines(data, data.extras, "minute", "max_stream_gap_ms", ax, label="longest stream gap"):
        return _none(fig, "Stream stalls", "no streamed responses in the window")
    ax.set_ylabel("ms")
    _legend(ax)
    return "Stream stalls (longest gap between chunks per minute)", _png(fig, data), ""


def weight_share(data: ReportData) -> Plot:
    """The published weight and the channel's share of its route."""
    fig, ax = _figure()
    if not _lines(data, data.verdicts, "ts", "weight", ax, label="weight"):
        return _none(fig, "Weight and route share", "no verdicts in the window")
    _lines(data, data.verdicts, "ts", "route_share", ax, "--", "route share")
    ax.set_ylim(-0.05, 1.05)
    _legend(ax)
    return "Weight and route share", _png(fig, data), ""


#: The plots in report order.
PLOTS: tuple[Callable[[ReportData], Plot], ...] = (state_bands, traffic, latency, error_rate, content, quota,
                                                   stalls, weight_share)
