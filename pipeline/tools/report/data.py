"""What an incident report reads from ClickHouse (issue #21), through the read-only query path.

Every query goes through :func:`pipeline.storage.query.run_readonly_query`
(readonly=1, limits), with values bound server-side, and is kept with its
parameters in :attr:`ReportData.queries` so the report can show the queries
behind each number.

Tables: ``channel_verdicts`` (states, reasons and the detectors' numbers the
worker published), ``channel_minute_stats`` (traffic and error rate per
event-time minute) and ``request_events`` (quota and stream stalls per
minute; quota is the stored ``quota_remaining`` share 0..1, NULL where the
gateway did not report it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from pipeline.config import QueryLimits
from pipeline.storage.query import run_readonly_query

#: Context kept on each side of an incident with ``--incident`` (before the first unhealthy verdict, after
#: the return to healthy): long enough to show the baseline the detectors compared against.
INCIDENT_MARGIN = timedelta(minutes=30)
#: States that are not an incident (``--incident`` looks for anything else).
CALM_STATES = frozenset({"healthy", "no_data"})
#: Verdict metrics the report plots and tabulates (keys of the verdict's ``metrics`` JSON, SPEC §3).
VERDICT_METRICS = ("p95_ms", "baseline_p95_ms", "latency_p95_ratio", "error_rate_5m", "error_rate_lower_5m",
                   "error_rate_trip", "requests_5m", "consecutive_failures", "missing_rate_5m",
                   "quality_score_5m", "quality_baseline", "route_share", "penalty", "quota_remaining",
                   "quota_drain_per_h", "next_probe_ts_ms")
#: Verdict metrics of the error class behind a verdict (SPEC §4.1, :mod:`pipeline.engine.error_classes`):
#: name → ClickHouse type, read for :func:`pipeline.alert.error_class_text.error_class_line`.
CLASS_METRICS = {"error_class": "Nullable(String)", "account": "Nullable(String)",
                 "account_channels": "Nullable(Int64)", "retry_after_s": "Nullable(Float64)",
                 "error_message": "Nullable(String)", "caller_errors_5m": "Nullable(Int64)"}

_SEL = "has({channels:Array(String)}, channel)"
_WIN = "ts >= {t0:DateTime64(3, 'UTC')} AND ts < {t1:DateTime64(3, 'UTC')}"

SQL_ROUTE_CHANNELS = ("SELECT DISTINCT channel FROM channel_health.channel_verdicts "
                      "WHERE route = {route:String} ORDER BY channel")
SQL_STATES = ("SELECT channel, ts, state FROM channel_health.channel_verdicts FINAL "
              f"WHERE {_SEL} ORDER BY ts, channel, seq")
SQL_VERDICTS = (
    "SELECT channel, route, ts, seq, state, weight, reasons, "
    + ", ".join(f"JSONExtract(metrics, '{k}', 'Nullable(Float64)') AS {k}" for k in VERDICT_METRICS)
    + ", " + ", ".join(f"JSONExtract(metrics, '{k}', '{t}') AS {k}" for k, t in CLASS_METRICS.items())
    + f" FROM channel_health.channel_verdicts FINAL WHERE {_SEL} AND {_WIN} ORDER BY channel, ts, seq"
)
SQL_MINUTES = (
    "SELECT channel, minute, requests, failures, error_rate, p95_latency_ms, missing_field_rate "
    "FROM channel_health.channel_minute_stats "
    "WHERE has({channels:Array(String)}, channel) "
    "AND minute >= toStartOfMinute({t0:DateTime64(3, 'UTC')}) AND minute < {t1:DateTime64(3, 'UTC')} "
    "ORDER BY channel, minute"
)
SQL_OVERRIDES = (
    "SELECT at, action, kind, channel, route, weight, by, key_id, reason, expires_ts "
    "FROM channel_health.channel_overrides "
    "WHERE (has({channels:Array(String)}, channel) OR has({routes:Array(String)}, route)) "
    "AND at >= {t0:DateTime64(3, 'UTC')} AND at < {t1:DateTime64(3, 'UTC')} ORDER BY at"
)
SQL_EXTRAS = (
    "SELECT channel, toDateTime64(toStartOfMinute(ts), 3, 'UTC') AS minute, "
    "min(quota_remaining) AS quota_remaining_min, max(max_stream_gap_ms) AS max_stream_gap_ms "
    f"FROM channel_health.request_events FINAL WHERE {_SEL} AND {_WIN} "
    "GROUP BY channel, minute ORDER BY channel, minute"
)


class ReportError(ValueError):
    """The report cannot be made as asked (nothing selected, no data, no incident); the message says why."""


@dataclass
class ReportData:
    """Everything one report shows, as read from ClickHouse.

    ``channels``: the selected channels; ``t0``/``t1``: the window, UTC,
    ``[t0, t1)``; ``verdicts`` / ``minutes`` / ``extras``: one dict per
    result row of :data:`SQL_VERDICTS` / :data:`SQL_MINUTES` /
    :data:`SQL_EXTRAS`, keyed by column name; ``queries``: ``(title, sql,
    params)`` of every query run, in order.
    """

    selection: str
    channels: list[str]
    t0: datetime
    t1: datetime
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    minutes: list[dict[str, Any]] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    queries: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    #: Rows of :data:`SQL_OVERRIDES`: operators' overrides set, cleared or expired in the window (issue #35);
    #: ``overrides_note`` says why there are none when the audit table could not be read.
    overrides: list[dict[str, Any]] = field(default_factory=list)
    overrides_note: str = ""

    def data_end(self, channel: str | None = None) -> datetime:
        """Where the data stops (UTC), at most :attr:`t1`: the newest verdict, or the end of the newest minute
        row, of ``channel`` (None: of any channel). :attr:`t0` when there is none. The state band ends here,
        not at the window's end (issue #35: it ran 30 minutes past the data)."""
        ends = [v["ts"] for v in self.verdicts if channel is None or v["channel"] == channel]
        ends += [m["minute"] + timedelta(minutes=1) for m in self.minutes + self.extras
                 if channel is None or m["channel"] == channel]
        return min(self.t1, max(ends, default=self.t0))

    def transitions(self) -> list[tuple[dict[str, Any] | None, dict[str, Any]]]:
        """``(previous verdict or None, verdict)`` for each verdict whose state differs from the
        channel's previous one in the window (the first verdict of each channel included), in time order."""
        out, last = [], {}
        for v in self.verdicts:
            prev = last.get(v["channel"])
            if prev is None or prev["state"] != v["state"]:
                out.append((prev, v))
            last[v["channel"]] = v
        return sorted(out, key=lambda p: (p[1]["ts"], p[1]["channel"], p[1]["seq"]))


def iso_utc(dt: datetime) -> str:
    """The report's one time notation: ISO 8601 UTC with ``Z``, to the second (``2026-05-28T21:30:00Z``)."""
    return utc(dt).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc(dt: datetime) -> datetime:
    """``dt`` as an aware UTC datetime (a naive one is taken as UTC, never as local time)."""
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def _param_time(dt: datetime) -> str:
    return utc(dt).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class _Reader:
    def __init__(self, client: Any, limits: QueryLimits | None):
        self.client, self.limits = client, limits
        self.queries: list[tuple[str, str, dict[str, Any]]] = []

    def rows(self, title: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        self.queries.append((title, sql, params))
        cols, rows = run_readonly_query(self.client, sql, params, self.limits)
        out = [dict(zip(cols, r)) for r in rows]
        for row in out:
            for k, v in row.items():
                if isinstance(v, datetime):
                    row[k] = utc(v)
        return out


def incident_window(states: list[dict[str, Any]], margin: timedelta = INCIDENT_MARGIN) -> tuple[datetime, datetime]:
    """The first incident in ``states`` (rows with ``ts``, ``state``, time order), widened by ``margin``.

    Starts at the first verdict in a state outside :data:`CALM_STATES` and
    ends at the first calm verdict after the last non-calm one that belongs
    to it (verdicts of all channels together: a route's incident lasts while
    any of its channels is unhealthy); with no return to calm, at the last
    verdict. Raises :class:`ReportError` when every verdict is calm.
    """
    start = next((i for i, r in enumerate(states) if r["state"] not in CALM_STATES), None)
    if start is None:
        raise ReportError("no incident: every verdict in the data is healthy or no_data "
                          "(give --from/--to to see a calm period)")
    unhealthy: dict[str, bool] = {}
    end = states[-1]["ts"]
    for r in states[start:]:
        unhealthy[r["channel"]] = r["state"] not in CALM_STATES
        if not any(unhealthy.values()):
            end = r["ts"]
            break
    t0 = states[start]["ts"] - margin
    return t0.replace(second=0, microsecond=0), end + margin


def load_report_data(client: Any, *, channel: str | None = None, route: str | None = None,
                     t0: datetime | None = None, t1: datetime | None = None, incident: bool = False,
                     limits: QueryLimits | None = None) -> ReportData:
    """Read one report's data: exactly one of ``channel`` / ``route``; the window ``[t0, t1)`` (UTC; naive
    = UTC), or ``incident`` (:func:`incident_window`), or neither (all verdicts of the selection).

    Raises :class:`ReportError` for a bad selection, an empty window, no verdicts, or no incident, and
    the query errors of :func:`~pipeline.storage.query.run_readonly_query`.
    """
    if (channel is None) == (route is None):
        raise ReportError("give exactly one of --channel or --route")
    if incident and (t0 is not None or t1 is not None):
        raise ReportError("--incident finds its own window; give it or --from/--to, not both")
    reader = _Reader(client, limits)
    if route is not None:
        channels = [r["channel"] for r in reader.rows("Channels of the route", SQL_ROUTE_CHANNELS, {"route": route})]
        if not channels:
            raise ReportError(f"no verdicts for route {route!r} in channel_health.channel_verdicts")
        selection = f"route {route}"
    else:
        channels, selection = [channel], f"channel {channel}"
    if t0 is None or t1 is None:
        states = reader.rows("States (to find the window)", SQL_STATES, {"channels": channels})
        if not states:
            raise ReportError(f"no verdicts for {selection} in channel_health.channel_verdicts")
        if incident:
            t0, t1 = incident_window(states)
        else:
            t0 = t0 or states[0]["ts"] - timedelta(minutes=1)
            t1 = t1 or states[-1]["ts"] + timedelta(milliseconds=1)
    t0, t1 = utc(t0), utc(t1)
    if t1 <= t0:
        raise ReportError(f"empty window: --to {t1.isoformat()} is not after --from {t0.isoformat()}")
    params = {"channels": channels, "t0": _param_time(t0), "t1": _param_time(t1)}
    data = ReportData(selection, channels, t0, t1)
    data.verdicts = reader.rows("Verdicts (states, reasons, detector numbers)", SQL_VERDICTS, params)
    data.minutes = reader.rows("Per-minute traffic and error rate", SQL_MINUTES, params)
    data.extras = reader.rows("Per-minute quota and stream stalls", SQL_EXTRAS, params)
    routes = sorted({str(v["route"]) for v in data.verdicts})
    try:
        data.overrides = reader.rows("Overrides set, cleared or expired (audit)", SQL_OVERRIDES,
                                     {**params, "routes": routes})
    except Exception as exc:  # an older database without the audit table: the report goes on, saying so
        data.overrides_note = f"overrides not read: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    data.queries = reader.queries
    if not data.verdicts and not data.minutes:
        raise ReportError(f"no verdicts and no requests for {selection} between {t0.isoformat()} and {t1.isoformat()}")
    return data
